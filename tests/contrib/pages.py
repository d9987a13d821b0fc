"""Reading the admins' pages, and what the overview should say of the seeded rows."""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from voltro_beat.contrib.overview import RECENT
from voltro_beat.status import UNFINISHED, Status

#: The columns of both runs lists, as their headings read, besides the name of the run: its
#: key in Django's, its schedule in sqladmin's (the key is the schedule and the instant).
COLUMNS = (
    "scheduled at",
    "status",
    "reason",
    "outcome",
    "replica",
    "worker",
    "lag",
    "duration",
    "retries",
)
#: The filters both runs lists are checked with: the columns and values they keep.
FILTERS = (
    {"status": "failed"},
    {"status": "missed"},
    {"coordination_outcome": "won_lock"},
    {"schedule": "boom-2s"},
    {"schedule": "flaky-3s", "status": "succeeded"},
)

_ROW = re.compile(r'<tr data-schedule="([^"]+)">(.*?)</tr>', re.S)
_INSTANT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


@dataclass(frozen=True)
class OverviewLine:
    squares: list[str]  # "key: status", oldest first
    rate: str
    outcomes: str
    upcoming: list[datetime]  # naive, in the page's time zone


def overview(page: str) -> dict[str, OverviewLine]:
    """The lines of a schedules overview page, by schedule."""
    found = {}
    for name, row in _ROW.findall(page):
        rate = re.search(r'class="vb-rate">([^<]*)<', row)
        outcomes = re.search(r'class="vb-outcomes"[^>]*>([^<]*)<', row)
        following = re.search(r'class="vb-next">(.*?)</td>', row, re.S)
        found[html.unescape(name)] = OverviewLine(
            squares=[
                html.unescape(title)
                for tag in re.findall(r"<a [^>]*vb-square[^>]*>", row)
                for title in re.findall(r'title="([^"]+)"', tag)
            ],
            rate=rate.group(1).strip() if rate else "",
            outcomes=html.unescape(outcomes.group(1).strip()) if outcomes else "",
            upcoming=[
                datetime.fromisoformat(t)
                for t in _INSTANT.findall(following.group(1) if following else "")
            ],
        )
    return found


def expected_overview(rows: Sequence[dict[str, Any]], schedule: str) -> tuple[list[str], str, str]:
    """The squares (oldest first), success rate and outcomes the overview should show for
    ``schedule``."""
    newest = sorted(
        (r for r in rows if r["schedule"] == schedule),
        key=lambda r: r["scheduled_at"],
        reverse=True,
    )[:RECENT]
    # Over the runs that executed: a missed or skipped run is not a failure.
    executed = [r for r in newest if r["status"] in (Status.SUCCEEDED, Status.FAILED)]
    succeeded = sum(r["status"] == Status.SUCCEEDED for r in executed)
    rate = f"{succeeded / len(executed):.0%}" if executed else "-"
    kinds = Counter(
        f"{r['status']} ({r['reason']})" if r["status"] in ("missed", "skipped") else r["status"]
        for r in newest
    )
    for status in UNFINISHED:
        kinds["unfinished"] += kinds.pop(status.value, 0)
    outcomes = ", ".join(f"{n} {kind}" for kind, n in _in_order(kinds) if n) or "-"
    return [f"{r['id']}: {r['status']}" for r in reversed(newest)], rate, outcomes


def _in_order(kinds: Counter[str]) -> list[tuple[str, int]]:
    """Succeeded, failed, revoked, rejected, then missed and skipped by reason, unfinished."""
    first = ["succeeded", "failed", "revoked", "rejected"]
    middle = sorted(k for k in kinds if k.startswith(("missed", "skipped")))
    return [(kind, kinds[kind]) for kind in (*first, *middle, "unfinished")]


def table_rows(page: str) -> list[str]:
    """The text of each table row of ``page``, tags stripped, whitespace collapsed."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S)
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", row)).split()) for row in rows]


def check_replicas(listed: str, detail: str, live: Any, gone: Any) -> None:
    """A replicas list page shows ``live`` then ``gone`` (the one seen last first) with their
    state, host, pid, clock offset and digest; ``live``'s page its settings and schedules."""
    rows = table_rows(listed)
    lines = {r.name: next(t for t in rows if f" {r.name} " in f" {t} ") for r in (live, gone)}
    for replica, state in ((live, "live"), (gone, "gone")):
        line = lines[replica.name]
        assert line.split()[:4] == [replica.name, state, replica.host, str(replica.pid)], line
        assert f"{replica.clock_offset:+.3f} s {replica.schedules_digest}" in line, line
    assert listed.index(live.name) < listed.index(gone.name)
    text = html.unescape(detail)
    for name, value in live.settings.items():
        assert f'"{name}": {json.dumps(value)}' in text, name


def check_shards(listed: str) -> None:
    """A shards list page (the rows of ``conftest.hold_shards``): owner, state and epoch."""
    rows = table_rows(listed)
    line = {n: next(t for t in rows if re.search(rf"\bdefault {n}\b", t)) for n in (0, 1, 2)}
    assert "owned" in line[0] and "beat-live" in line[0] and "not owned" not in line[0], line
    assert re.search(r"owned beat-live 2\b", line[1]), line[1]
    assert "not owned" in line[2], line[2]


def check_singletons(listed: str) -> None:
    """A singletons list page (the rows of ``conftest.hold_shards``)."""
    rows = table_rows(listed)
    inbox = next(t for t in rows if " inbox " in f" {t} ")
    reconcile = next(t for t in rows if " reconcile " in f" {t} ")
    assert "running beat-live 1" in inbox, inbox
    assert "failed beat-gone 2" in reconcile and "ledger unreachable" in reconcile, reconcile
