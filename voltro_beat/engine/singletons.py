"""Runs this replica's singletons: those of its group whose shard it owns.

Each runs on a thread of the beat process. A thread, not a child process: it lives and dies
with the replica that owns it (a ``kill -9`` or an OOM kill of beat takes it along, a
``SIGSTOP`` pauses both), so no copy outlives the process whose heartbeat holds its shard, and
it needs no pickling or start-up. The price is that it cannot be killed: stopping is
cooperative (the context's stop event), and a copy that has not returned ``grace`` after it was
asked to is logged as an error, once. That is what the fencing token is for: an owner that lost
the shard and has not noticed yet (paused past its lease) writes with an older token, which a
write that checks it refuses.

At every heartbeat the engine calls :meth:`Singletons.follow` with the shards it holds:

- a singleton whose shard it holds and that has no copy running at that epoch is started, once
  an earlier copy has ended;
- one whose shard it no longer holds (or holds at another epoch) is asked to stop;
- a copy that returned is not run again until ownership moves; one that raised is recorded
  with its traceback and stays stopped, unless it asks for ``restart`` (then it starts again
  after 1, 2, 4 ... 60 s while this replica still owns it).

Each change is noted in ``_voltro_beat_singletons`` (``voltro-beat shards`` shows it).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from voltro_beat import logs
from voltro_beat.config import Settings
from voltro_beat.exceptions import StoreError
from voltro_beat.shards import shard_of
from voltro_beat.singletons import Context, Singleton
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)

#: Seconds before a restart after a failure, doubling per failure in a row, up to MAX_BACKOFF.
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0


@dataclass
class _Copy:
    """One copy of a singleton, started at ``token``."""

    singleton: Singleton
    token: int
    stop: threading.Event
    thread: threading.Thread
    #: ``returned`` or ``failed`` once its function is done; its traceback if it failed.
    outcome: str | None = None
    error: str | None = None
    stop_asked: float | None = None
    warned: bool = False
    #: Whether its end was seen (logged, and its failure counted).
    ended: bool = False
    #: Failures in a row at this token, and when it may start again.
    failures: int = 0
    retry_at: float = 0.0
    noted: set[str] = field(default_factory=set)


class Singletons:
    """The singletons of this replica's group, run where this replica owns their shard."""

    def __init__(self, declared: Sequence[Singleton], store: BeatStore, settings: Settings) -> None:
        self._store = store
        self._replica = settings.replica
        self._mine = [s for s in declared if s.group == settings.group]
        self._shard = {s.name: shard_of(s.group, s.name, settings.shards) for s in self._mine}
        #: The latest copy of each singleton (running, stopping or done).
        self._copies: dict[str, _Copy] = {}

    def __bool__(self) -> bool:
        return bool(self._mine)

    def follow(self, held: Mapping[int, int]) -> None:
        """Start, stop and restart copies as the shards ``held`` (shard -> epoch) say."""
        now = time.monotonic()
        for s in self._mine:
            token = held.get(self._shard[s.name])
            copy = self._copies.get(s.name)
            if copy is not None:
                self._watch(copy, token, now)
            if token is None or (copy is not None and copy.thread.is_alive()):
                continue
            if copy is None or copy.token != token:
                self._start(s, token, failures=0)
            elif copy.outcome == "failed" and s.restart and now >= copy.retry_at:
                self._start(s, token, failures=copy.failures)

    def stop_all(self) -> None:
        """Ask every copy to stop and wait for each up to its grace (beat is stopping)."""
        asked = time.monotonic()
        for copy in self._copies.values():
            self._ask_stop(copy, asked)
        for copy in self._copies.values():
            grace = copy.singleton.grace.total_seconds()
            copy.thread.join(max(grace - (time.monotonic() - asked), 0.0))
            self._watch(copy, None, asked + grace + 1)

    def _start(self, s: Singleton, token: int, *, failures: int) -> None:
        stop = threading.Event()
        context = Context(
            s.name,
            s.group,
            token,
            self._replica,
            stop,
            logging.getLogger(f"voltro_beat.singleton.{s.name}"),
        )
        copy = _Copy(s, token, stop, threading.Thread(daemon=True), failures=failures)

        def body() -> None:
            try:
                s.run(context)
                copy.outcome = "returned"
            except BaseException:
                copy.error = traceback.format_exc()
                copy.outcome = "failed"

        copy.thread = threading.Thread(target=body, name=f"voltro-singleton-{s.name}", daemon=True)
        self._copies[s.name] = copy
        logger.info(
            "voltro_beat: singleton %s (group %s) starts here, token %d",
            s.name,
            s.group,
            token,
            extra=logs.fields(schedule=s.name, replica=self._replica),
        )
        copy.thread.start()
        self._note(copy, "running")

    def _watch(self, copy: _Copy, token: int | None, now: float) -> None:
        s = copy.singleton
        if token != copy.token:
            self._ask_stop(copy, now)
        if copy.thread.is_alive():
            stuck = copy.stop_asked is not None and now - copy.stop_asked > s.grace.total_seconds()
            if stuck and not copy.warned:
                copy.warned = True
                logger.error(
                    "voltro_beat: singleton %s (token %d) has not returned %g s after it was "
                    "asked to stop: another replica may be running it now; its writes must "
                    "check its token",
                    s.name,
                    copy.token,
                    s.grace.total_seconds(),
                    extra=logs.fields(schedule=s.name, replica=self._replica),
                )
            return
        if copy.ended:
            self._note(copy, copy.outcome if copy.stop_asked is None else "stopped", copy.error)
            return
        copy.ended = True
        if copy.outcome == "failed":
            copy.failures += 1
            backoff = min(FIRST_BACKOFF * 2 ** (copy.failures - 1), MAX_BACKOFF)
            copy.retry_at = now + backoff
            logger.error(
                "voltro_beat: singleton %s (token %d) failed%s:\n%s",
                s.name,
                copy.token,
                f"; restarting in {backoff:g} s" if s.restart else "; not restarted",
                copy.error,
                extra=logs.fields(schedule=s.name, replica=self._replica),
            )
        elif copy.outcome == "returned":
            logger.info(
                "voltro_beat: singleton %s (token %d) returned; it runs again when its shard "
                "changes owner",
                s.name,
                copy.token,
                extra=logs.fields(schedule=s.name, replica=self._replica),
            )
        self._note(copy, copy.outcome if copy.stop_asked is None else "stopped", copy.error)

    def _ask_stop(self, copy: _Copy, now: float) -> None:
        if copy.stop_asked is None and copy.thread.is_alive():
            copy.stop_asked = now
            copy.stop.set()
            logger.info(
                "voltro_beat: singleton %s (token %d) asked to stop: its shard moved or beat stops",
                copy.singleton.name,
                copy.token,
                extra=logs.fields(schedule=copy.singleton.name, replica=self._replica),
            )

    def _note(self, copy: _Copy, state: str | None, error: str | None = None) -> None:
        """Record ``state`` once per copy; a store error is logged, not raised (the copy's
        fate does not wait for the store), and the next heartbeat tries again."""
        state = state or "stopped"
        if state in copy.noted:
            return
        copy.noted.add(state)
        try:
            self._store.record_singleton(
                copy.singleton.group,
                copy.singleton.name,
                token=copy.token,
                state=state,
                error=error,
            )
        except StoreError as exc:
            copy.noted.discard(state)
            logger.warning(
                "voltro_beat: could not record singleton %s as %s: %s",
                copy.singleton.name,
                state,
                exc,
            )
