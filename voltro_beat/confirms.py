"""RabbitMQ's publisher confirms: which of the messages the publisher sent on one channel the
broker took, and which it refused."""

from __future__ import annotations

import time
from typing import Any

from kombu import Connection

#: On AMQP, the publisher waits for the broker's confirms after this many messages: a
#: connection lost meanwhile leaves at most that many in doubt (sent again, same task ids),
#: and a thousand messages cost ten round trips, not a thousand.
CONFIRM_EVERY = 100


class Confirms:
    """RabbitMQ's publisher confirms on one channel, waited for a batch at a time.

    The channel is in confirm mode: the broker answers each message with an ack (it took it)
    or a nack (it refused it: a queue at ``x-max-length`` with ``reject-publish``, an internal
    queue error), by delivery tag (1, 2, ... in publish order), several at once when
    ``multiple``. Waiting for the last tag of a batch (:data:`CONFIRM_EVERY` messages) costs
    about one round trip for the whole batch, where waiting for each message (kombu's
    ``confirm_publish``) costs one per message.
    """

    def __init__(self, channel: Any) -> None:
        channel.confirm_select()
        #: The tags handed out on this channel so far (one per basic.publish).
        self.published = 0
        #: The broker answered for every tag up to this one.
        self.answered = 0
        #: The answered tags it refused (until the publisher collects them).
        self.refused: set[int] = set()
        #: Answers beyond ``answered`` (tag -> refused), out of order.
        self._early: dict[int, bool] = {}
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._answer(tag, multiple, refused=False)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._answer(tag, multiple, refused=True)

    def _answer(self, tag: int, multiple: bool, *, refused: bool) -> None:
        for t in range(self.answered + 1, tag + 1) if multiple else (tag,):
            self._early.setdefault(t, refused)
        while self.answered + 1 in self._early:
            self.answered += 1
            if self._early.pop(self.answered):
                self.refused.add(self.answered)

    def wait(self, connection: Connection, timeout: float) -> None:
        """Until the broker answered every message published so far; raises if the answers
        do not come within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.answered < self.published:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no publisher confirm within {timeout:g} s")
            connection.drain_events(timeout=remaining)

    def collect(self, first: int) -> dict[int, str]:
        """The refused messages published after tag ``first``, by their index from it."""
        refused = {
            tag - first - 1: "refused by the broker (basic.nack)"
            for tag in self.refused
            if tag > first
        }
        self.refused.clear()
        return refused
