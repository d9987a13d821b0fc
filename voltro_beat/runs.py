"""The run of an occurrence as beat records it through the gate, and as it reads it back.

Pure: an :class:`~voltro_beat.occurrences.Occurrence` names what runs; a :class:`Run` is what
the store knows about that run (its row in ``_voltro_schedule_runs``, beat's columns of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from voltro_beat.occurrences import Occurrence
from voltro_beat.status import Status


@dataclass(frozen=True, slots=True)
class Run:
    """The run of ``occurrence``, which calls ``task``.

    To record: ``claimed`` (to publish, never after ``deadline``: the instant plus the entry's
    ``max_lateness``, guarantee 6), or ``missed`` / ``skipped`` / ``queued`` with a ``reason``.
    Read back from its row: its ``status`` and ``reason``, and ``since``, when it last moved
    (started, else published, else claimed).
    """

    occurrence: Occurrence
    task: str
    status: Status = Status.CLAIMED
    reason: str | None = None
    deadline: datetime | None = None
    since: datetime | None = None
    #: The revision of the schedules table that fired it (None: the app's own entry, or an
    #: operator's command). The store refuses it if its schedule changed before its instant.
    revision: int | None = None
