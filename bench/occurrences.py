"""Benchmark: the cost of voltro_beat's occurrence maths against croniter's own, in one run.

    .venv/bin/python bench/occurrences.py [--schedules 10000] [--rounds 3]

For 10,000 distinct cron schedules spread over five zones, times ``next_after`` (warm: one
croniter per spec is cached) against croniter's ``get_next`` on prebuilt croniter objects
asked the same question (start time in the schedule's zone), then the same in UTC only, a walk
through consecutive occurrences, the first call (croniter construction included) and
intervals. Prints a markdown table and writes ``bench/results/occurrences.json``. Schedules
are timed 100 at a time, the two sides alternating, and each chunk's best round counts.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar
from zoneinfo import ZoneInfo

from croniter import croniter

from voltro_beat import occurrences
from voltro_beat.occurrences import next_after, occurrence_key
from voltro_beat.schedules import CronSpec, IntervalSpec, to_spec

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Lord_Howe"]
DAYS_OF_WEEK = ["*", "1-5", "0,6", "1", "3", "5", "2,4"]
AFTER = datetime(2024, 5, 14, 10, 17, 23, 456_789, tzinfo=UTC)
RESULTS = Path(__file__).parent / "results" / "occurrences.json"
CHUNK = 100  # schedules timed together
WALK = 10  # consecutive occurrences per walk
T = TypeVar("T")


def expressions(count: int) -> list[str]:
    """``count`` distinct cron expressions: every minute of the day on various weekdays."""
    exprs = [
        f"{minute} {hour} * * {dow}"
        for dow in DAYS_OF_WEEK
        for hour in range(24)
        for minute in range(60)
    ]
    if count > len(exprs):
        raise SystemExit(f"at most {len(exprs)} distinct schedules")
    # A fixed shuffle, so that any count mixes hours and weekdays, the same in every run.
    return random.Random(0).sample(exprs, count)


def measure(
    items: Sequence[T],
    ours: Callable[[T], object],
    theirs: Callable[[T], object] | None = None,
    *,
    rounds: int,
    per_item: int = 1,
) -> tuple[float, float | None]:
    """Microseconds per call of ``ours`` (and ``theirs``) over ``items``.

    The items are timed in chunks, the two sides alternating within each chunk, and each
    chunk's best round counts: on a busy machine a burst of load then hits both sides alike.
    """
    sides = [ours] if theirs is None else [ours, theirs]
    chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    best = [[math.inf] * len(sides) for _ in chunks]
    gc.collect()
    gc.disable()
    try:
        for round_ in range(rounds):
            for c, chunk in enumerate(chunks):
                order = range(len(sides)) if (round_ + c) % 2 == 0 else reversed(range(len(sides)))
                for side in order:
                    function = sides[side]
                    start = time.perf_counter_ns()
                    for item in chunk:
                        function(item)
                    best[c][side] = min(best[c][side], time.perf_counter_ns() - start)
    finally:
        gc.enable()
    calls = len(items) * per_item
    costs = [
        sum(chunk_best[side] for chunk_best in best) / 1000 / calls for side in range(len(sides))
    ]
    return costs[0], costs[1] if theirs is not None else None


@dataclass(frozen=True)
class Case:
    """One cron schedule, asked the same question by both sides."""

    expr: str
    spec: CronSpec
    croniter: croniter
    start: datetime  # AFTER in the schedule's zone: croniter computes in the start's zone
    naive: croniter  # the same, on naive wall-clock time, as next_after calls it
    wall: datetime


def cases(exprs: Sequence[str], zones: Sequence[str]) -> list[Case]:
    found = []
    for i, expr in enumerate(exprs):
        zone = zones[i % len(zones)]
        spec = to_spec(expr, tz=zone)
        assert isinstance(spec, CronSpec)
        start = AFTER.astimezone(ZoneInfo(zone))
        wall = start.replace(tzinfo=None, microsecond=0)
        found.append(Case(expr, spec, croniter(expr, start), start, croniter(expr, wall), wall))
    return found


def run(count: int, rounds: int) -> list[dict[str, object]]:
    exprs = expressions(count)
    assert len(set(exprs)) == count
    rows = []

    def ours(case: Case) -> object:
        return next_after(case.spec, AFTER)

    def theirs(case: Case) -> object:
        return case.croniter.get_next(datetime, start_time=case.start)

    def theirs_naive(case: Case) -> object:
        return case.naive.get_next(datetime, start_time=case.wall)

    for label, zones in [(f"{len(ZONES)} zones", ZONES), ("UTC", ["UTC"])]:
        warm = cases(exprs, zones)
        for case in warm:  # builds the cached croniter objects
            ours(case)
        if len(zones) > 1:
            # next_after's own overhead: against the very croniter call it makes inside.
            rows.append(
                row(
                    f"next_after vs croniter on naive wall time, {count} schedules, {label}",
                    count,
                    *measure(warm, ours, theirs_naive, rounds=rounds),
                )
            )
        rows.append(
            row(
                f"next_after, {count} cron schedules, {label}",
                count,
                *measure(warm, ours, theirs, rounds=rounds),
            )
        )

    # The scheduler's pattern: from one occurrence on to the next.
    def walk_ours(case: Case) -> None:
        at: datetime | None = AFTER
        for _ in range(WALK):
            at = next_after(case.spec, at)  # type: ignore[arg-type]

    def walk_theirs(case: Case) -> None:
        case.croniter.set_current(case.start, force=True)
        for _ in range(WALK):
            case.croniter.get_next(datetime)

    walkers = cases(exprs[: count // WALK], ZONES)
    rows.append(
        row(
            f"walk {WALK} consecutive occurrences, {len(walkers)} cron schedules",
            len(walkers) * WALK,
            *measure(walkers, walk_ours, walk_theirs, rounds=rounds, per_item=WALK),
        )
    )

    # The first call: croniter's parsing included on both sides.
    def cold_ours(case: Case) -> object:
        occurrences._cron_cache.iters.pop(case.spec, None)
        return next_after(case.spec, AFTER)

    def cold_theirs(case: Case) -> object:
        return croniter(case.expr, case.start).get_next(datetime)

    cold = cases(exprs, ZONES)
    rows.append(
        row(
            f"first call (croniter built), {count} cron schedules",
            count,
            *measure(cold, cold_ours, cold_theirs, rounds=rounds),
        )
    )

    # Intervals need no croniter at all; compared with croniter's cost for UTC cron schedules.
    pairs = list(
        zip(
            (IntervalSpec((i + 1) * 1000) for i in range(count)), cases(exprs, ["UTC"]), strict=True
        )
    )
    voltro, cron = measure(
        pairs,
        lambda pair: next_after(pair[0], AFTER),
        lambda pair: theirs(pair[1]),
        rounds=rounds,
    )
    rows.append(row(f"next_after, {count} intervals (vs croniter, UTC cron)", count, voltro, cron))

    keyed = [(expr.replace(" ", "_"), AFTER + timedelta(seconds=i)) for i, expr in enumerate(exprs)]
    key_cost, _ = measure(keyed, lambda pair: occurrence_key(*pair), rounds=rounds)
    rows.append(row(f"occurrence_key, {count} instants", count, key_cost, None))
    return rows


def row(name: str, calls: int, voltro_us: float, croniter_us: float | None) -> dict[str, object]:
    return {
        "case": name,
        "calls": calls,
        "voltro_us_per_call": round(voltro_us, 3),
        "croniter_us_per_call": None if croniter_us is None else round(croniter_us, 3),
        "ratio": None if croniter_us is None else round(voltro_us / croniter_us, 3),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rows = run(args.schedules, args.rounds)

    print("| case | calls | voltro µs/call | croniter µs/call | ratio |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        cron = "" if r["croniter_us_per_call"] is None else f"{r['croniter_us_per_call']:.2f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        print(f"| {r['case']} | {r['calls']} | {r['voltro_us_per_call']:.2f} | {cron} | {ratio} |")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "croniter": version("croniter"),
                "rounds": args.rounds,
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwritten to {RESULTS}")


if __name__ == "__main__":
    main()
