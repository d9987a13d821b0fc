"""Reading the admins' pages, and what the overview should say of the seeded rows."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from voltro_beat.contrib.overview import RECENT
from voltro_beat.status import TERMINAL, Status

#: The columns of both runs lists, as their headings read.
COLUMNS = (
    "schedule",
    "scheduled at",
    "status",
    "reason",
    "outcome",
    "replica",
    "worker",
    "publish lag",
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
    upcoming: list[datetime]  # naive, in the page's time zone


def overview(page: str) -> dict[str, OverviewLine]:
    """The lines of a schedules overview page, by schedule."""
    found = {}
    for name, row in _ROW.findall(page):
        rate = re.search(r'class="vb-rate">([^<]*)<', row)
        following = re.search(r'class="vb-next">(.*?)</td>', row, re.S)
        found[html.unescape(name)] = OverviewLine(
            squares=[
                html.unescape(title)
                for tag in re.findall(r"<a [^>]*vb-square[^>]*>", row)
                for title in re.findall(r'title="([^"]+)"', tag)
            ],
            rate=rate.group(1).strip() if rate else "",
            upcoming=[
                datetime.fromisoformat(t)
                for t in _INSTANT.findall(following.group(1) if following else "")
            ],
        )
    return found


def expected_overview(rows: Sequence[dict[str, Any]], schedule: str) -> tuple[list[str], str]:
    """The squares (oldest first) and success rate the overview should show for ``schedule``."""
    newest = sorted(
        (r for r in rows if r["schedule"] == schedule),
        key=lambda r: r["scheduled_at"],
        reverse=True,
    )[:RECENT]
    finished = [r for r in newest if r["status"] in TERMINAL]
    succeeded = sum(r["status"] == Status.SUCCEEDED for r in finished)
    rate = f"{succeeded / len(finished):.0%}" if finished else "-"
    return [f"{r['id']}: {r['status']}" for r in reversed(newest)], rate


def table_rows(page: str) -> list[str]:
    """The text of each table row of ``page``, tags stripped, whitespace collapsed."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S)
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", row)).split()) for row in rows]


def replica_lines(page: str, names: Sequence[str]) -> dict[str, str]:
    """The row text of each replica in ``names`` on a replicas list ``page``."""
    rows = table_rows(page)
    return {name: next(r for r in rows if f" {name} " in f" {r} ") for name in names}
