"""How a schedule's runs turned out: outcomes by kind, and a success rate over the runs that
executed.

A ``skipped`` run is the overlap policy doing its job, a ``missed`` one the catch-up policy or
the lateness bound doing theirs: neither executed, so neither counts against the success rate.
``voltro-beat status`` and both admins' overview read their numbers from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from voltro_beat.status import UNFINISHED, Status

#: The kinds an outcome list shows besides missed (which shows by reason), in its order.
_KINDS = (Status.SUCCEEDED, Status.FAILED, Status.REVOKED, Status.REJECTED)
#: A missed or skipped row without a reason (rows written before reasons were recorded).
NO_REASON = "no reason"


@dataclass(frozen=True, slots=True)
class Tally:
    """Runs counted by status, and the missed and skipped ones by reason."""

    statuses: Mapping[str, int] = field(default_factory=dict)
    #: Reason -> missed runs.
    missed: Mapping[str, int] = field(default_factory=dict)
    #: Reason -> skipped runs (``overlap``: the predecessor was still running).
    skipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    @property
    def executed(self) -> int:
        """Runs that ran to an end on a worker: succeeded or failed."""
        return self.statuses.get(Status.SUCCEEDED, 0) + self.statuses.get(Status.FAILED, 0)

    @property
    def success_rate(self) -> float | None:
        """Succeeded over succeeded + failed; None while nothing executed."""
        executed = self.executed
        return None if not executed else self.statuses.get(Status.SUCCEEDED, 0) / executed

    @property
    def unfinished(self) -> int:
        return sum(n for s, n in self.statuses.items() if s in UNFINISHED)

    def outcomes(self) -> list[tuple[str, int]]:
        """``(kind, count)`` of each kind present: succeeded, failed, revoked, rejected, missed
        by reason (``missed (catch_up)``), skipped by reason, unfinished."""
        found = [(kind.value, self.statuses.get(kind, 0)) for kind in _KINDS]
        found += [(f"missed ({reason})", n) for reason, n in sorted(self.missed.items())]
        found += [(f"skipped ({reason})", n) for reason, n in sorted(self.skipped.items())]
        found.append(("unfinished", self.unfinished))
        return [(kind, n) for kind, n in found if n]

    @property
    def outcomes_text(self) -> str:
        """``"40 succeeded, 2 failed, 3 missed (catch_up)"``; ``-`` for no runs."""
        return ", ".join(f"{n} {kind}" for kind, n in self.outcomes()) or "-"

    @property
    def success_text(self) -> str:
        """The success rate as a whole percentage; ``-`` while nothing executed."""
        rate = self.success_rate
        return "-" if rate is None else f"{rate:.0%}"


def tally(rows: Iterable[tuple[str, str | None, int]]) -> Tally:
    """The :class:`Tally` of ``rows``: ``(status, reason, count)`` each, the same status and
    reason possibly more than once (the reason matters for missed and skipped rows only)."""
    statuses: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for status, reason, count in rows:
        statuses[status] += count
        if status == Status.MISSED:
            missed[reason or NO_REASON] += count
        elif status == Status.SKIPPED:
            skipped[reason or NO_REASON] += count
    return Tally(dict(statuses), dict(missed), dict(skipped))
