"""The coordination gate: which due occurrences this replica may publish.

``advisory_lock`` (the default on every SQL store) sends each key through the claims table:
only the replica whose INSERT went in publishes. ``single`` trusts that one beat runs and
skips the claims table; its run rows are still the last fence. A store that cannot be shared
(``memory://``) always runs ``single``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from voltro_beat.store import Occurrence, Store

logger = logging.getLogger(__name__)

#: The outcome recorded on each run row, by coordination mode.
OUTCOMES = {"single": "single", "advisory_lock": "won_lock"}


@dataclass(frozen=True, slots=True)
class Gate:
    """A coordination mode bound to a store."""

    mode: str
    store: Store

    @property
    def outcome(self) -> str:
        return OUTCOMES[self.mode]

    def admit(self, occurrences: Sequence[Occurrence], *, now: datetime) -> set[str]:
        """Record ``occurrences`` and return the keys this replica won."""
        return self.store.claim(
            occurrences, outcome=self.outcome, gate=self.mode != "single", now=now
        )


def gate_for(mode: str, store: Store) -> Gate:
    """The gate for ``mode`` on ``store``, falling back to ``single`` where nothing is shared."""
    if mode != "single" and not store.shared:
        logger.warning(
            "voltro_beat: coordination %r needs a shared store; %s is private to this "
            "process, so running as 'single': start only one beat",
            mode,
            store.display_url,
        )
        mode = "single"
    return Gate(mode, store)
