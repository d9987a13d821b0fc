"""Benchmark: the cost of voltro_beat's occurrence maths against croniter's own, in one run.

    .venv/bin/python bench/occurrences.py [--schedules 10000] [--rounds 3]

10,000 distinct cron expressions, spread over five zones (and once more all in UTC). Every
timed call asks a question never asked before, so ``next_after``'s per-thread memo of the last
``(spec, after)`` can never answer it: the instants are random (a fresh set per round and per
row) or the occurrences of a walk, each asked once. Each row gives both sides the same UTC
instants, and croniter the expression in the schedule's zone:

(a) cold: a schedule never seen before, one question. ``next_after(expr, after, tz=zone)``
    with voltro_beat's caches emptied (parsing, validation, per-spec state) against
    ``croniter(expr, after in zone).get_next(datetime)``.
(a) fresh question on a parsed schedule: the spec validated and croniter built beforehand,
    untimed; ``next_after(spec, after)`` against ``get_next(datetime, start_time=after in
    zone)`` on the kept croniter.
(b) walk: 10 consecutive occurrences from a random instant, each answer the next question,
    against ``set_current`` and 10 ``get_next`` on the kept croniter.
(c) intervals: the same fresh questions and walks on interval schedules, against croniter's
    cost for the cron row they are timed with.

Schedules are timed 100 at a time, the sides taking turns to go first, and each chunk's best
round counts (a burst of load on a shared machine then hits every side alike); the spread of
the per-round ratios and the load average show how noisy the run was. Before timing, an
untimed pass over a spare set of questions checks that no call was answered by the memo.
Prints a markdown table and writes ``bench/results/occurrences.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from voltro_beat import cron
from voltro_beat.occurrences import next_after, occurrence_key
from voltro_beat.schedules import CronSpec, IntervalSpec, to_spec

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Lord_Howe"]
DAYS_OF_WEEK = ["*", "1-5", "0,6", "1", "3", "5", "2,4"]
# Questions are random instants in these three years (DST changes included).
SPAN_START = datetime(2024, 1, 1, tzinfo=UTC)
SPAN_US = 3 * 365 * 86_400 * 1_000_000
RESULTS = Path(__file__).parent / "results" / "occurrences.json"
CHUNK = 100  # schedules timed together
WALK = 10  # consecutive occurrences per walk
WALKERS = 1000  # schedules walked (croniter's walk is the slowest row)
# voltro_beat's per-expression caches, emptied for the cold row.
PARSE_CACHES = (cron.parse_text, cron._facts, cron._interned)

Item = Any
Side = Callable[[Sequence[Item]], int]  # times one chunk, in nanoseconds


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


@dataclass(frozen=True)
class Schedule:
    """One cron schedule, with what each side keeps between questions."""

    expr: str
    tz: str
    zone: ZoneInfo
    spec: CronSpec  # validated as a scheduler validates at boot
    croniter: croniter  # croniter's kept iterator, in the schedule's zone


def schedules_in(exprs: Sequence[str], zones: Sequence[str]) -> list[Schedule]:
    found = []
    for i, expr in enumerate(exprs):
        tz = zones[i % len(zones)]
        zone = ZoneInfo(tz)
        spec = to_spec(expr, tz=tz)
        assert isinstance(spec, CronSpec)
        found.append(Schedule(expr, tz, zone, spec, croniter(expr, SPAN_START.astimezone(zone))))
    return found


def instants(count: int, seed: str) -> list[datetime]:
    """``count`` random instants (to the microsecond), the same for the same seed."""
    rng = random.Random(seed)
    return [SPAN_START + timedelta(microseconds=rng.randrange(SPAN_US)) for _ in range(count)]


def questions(things: Sequence[Item], row: str, rounds: int) -> list[list[tuple[Item, datetime]]]:
    """Per round, each thing paired with its own random instant; round ``rounds`` is spare."""
    return [
        list(zip(things, instants(len(things), f"{row}/{r}"), strict=True))
        for r in range(rounds + 1)
    ]


def timed(call: Callable[[Item], object], before: Callable[[], object] | None = None) -> Side:
    """A side that calls ``call`` on each item of a chunk (``before`` runs first, untimed)."""

    def side(chunk: Sequence[Item]) -> int:
        if before is not None:
            before()
        start = time.perf_counter_ns()
        for item in chunk:
            call(item)
        return time.perf_counter_ns() - start

    return side


@dataclass
class Timing:
    """Nanoseconds per (round, chunk, side)."""

    ns: list[list[list[int]]]
    calls: int  # per side and round

    def best_us(self, side: int) -> float:
        """µs per call: each chunk's best round, summed over the chunks."""
        chunks = range(len(self.ns[0]))
        return sum(min(r[c][side] for r in self.ns) for c in chunks) / 1000 / self.calls

    def round_ratios(self, side: int, against: int) -> list[float]:
        return [sum(c[side] for c in r) / sum(c[against] for c in r) for r in self.ns]

    def spread(self, side: int) -> float:
        """Median over chunks of (slowest round / fastest round): the timing noise."""
        per_chunk = sorted(
            max(r[c][side] for r in self.ns) / min(r[c][side] for r in self.ns)
            for c in range(len(self.ns[0]))
        )
        return per_chunk[len(per_chunk) // 2]


def measure(
    items_by_round: Sequence[Sequence[Item]], sides: Sequence[Side], per_item: int = 1
) -> Timing:
    """Time every side on the same items, chunk by chunk, the sides taking turns to go first."""
    ns = []
    for round_, items in enumerate(items_by_round):
        chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
        per_round = []
        gc.collect()
        gc.disable()
        try:
            for c, chunk in enumerate(chunks):
                took = [0] * len(sides)
                first = (round_ + c) % len(sides)
                for side in [*range(first, len(sides)), *range(first)]:
                    took[side] = sides[side](chunk)
                per_round.append(took)
        finally:
            gc.enable()
        ns.append(per_round)
    return Timing(ns, len(items_by_round[0]) * per_item)


@contextmanager
def counting_searches() -> Iterator[list[int]]:
    """Count the cron searches ``next_after`` makes (a memo hit makes none)."""
    count = [0]
    search = cron._search

    def counted(*args: Any) -> datetime | None:
        count[0] += 1
        return search(*args)

    cron._search = counted  # type: ignore[assignment]
    try:
        yield count
    finally:
        cron._search = search  # type: ignore[assignment]


def check_no_memo(
    name: str, call: Callable[[Item], object], items: Sequence[Item], searches: int
) -> None:
    """An untimed pass over spare questions: every call must search, none hit the memo."""
    with counting_searches() as count:
        for item in items:
            call(item)
    if count[0] != searches:
        raise SystemExit(f"{name}: {count[0]} cron searches for {searches} questions: memo hits")


def distinct_per_round(rounds: Sequence[Sequence[tuple[Item, datetime]]]) -> None:
    """No thing is asked the same instant in two rounds (so a memo could never carry over)."""
    asked: set[tuple[int, datetime]] = set()
    for items in rounds:
        for thing, after in items:
            key = (id(thing), after)
            assert key not in asked, "a question repeats between rounds"
            asked.add(key)


def empty_caches() -> None:
    for cache in PARSE_CACHES:
        cache.cache_clear()
    cron._states.by_spec.clear()


def run(count: int, rounds: int) -> list[dict[str, object]]:
    exprs = expressions(count)
    assert len(set(exprs)) == count
    zoned = schedules_in(exprs, ZONES)
    utc = schedules_in(exprs, ["UTC"])
    intervals = [IntervalSpec((i + 1) * 1_000_000) for i in range(count)]  # 1 s to `count` s
    rows: list[dict[str, object]] = []

    # (a) cold: a schedule never seen, from its expression, on both sides.
    def cold_ours(item: tuple[Schedule, datetime]) -> object:
        s, after = item
        return next_after(s.expr, after, tz=s.tz)

    def cold_theirs(item: tuple[Schedule, datetime]) -> object:
        s, after = item
        return croniter(s.expr, after.astimezone(s.zone)).get_next(datetime)

    qs = questions(zoned, "cold", rounds)
    empty_caches()
    misses = cron._facts.cache_info().misses
    check_no_memo("cold", cold_ours, qs[-1], count)
    assert cron._facts.cache_info().misses - misses == count, "cold calls parsed"
    agree(qs[-1][:CHUNK], cold_ours, cold_theirs, zoned=True)
    timing = measure(qs[:-1], [timed(cold_ours, empty_caches), timed(cold_theirs)])
    rows.append(row(f"(a) cold: first question, {count} schedules, 5 zones", timing))
    for s in zoned + utc:  # the parsed schedules the next rows use
        to_spec(s.expr, tz=s.tz)

    # (a) a fresh question on a parsed schedule, croniter's iterator kept.
    def fresh_ours(item: tuple[Schedule, datetime]) -> object:
        return next_after(item[0].spec, item[1])

    def fresh_theirs(item: tuple[Schedule, datetime]) -> object:
        s, after = item
        return s.croniter.get_next(datetime, start_time=after.astimezone(s.zone))

    qs = questions(zoned, "fresh-zoned", rounds)
    distinct_per_round(qs)
    check_no_memo("fresh, 5 zones", fresh_ours, qs[-1], count)
    agree(qs[-1][:CHUNK], fresh_ours, fresh_theirs, zoned=True)
    timing = measure(qs[:-1], [timed(fresh_ours), timed(fresh_theirs)])
    rows.append(row(f"(a) fresh question, parsed schedule, {count} schedules, 5 zones", timing))

    # The same in UTC, timed with (c): intervals asked the same instants.
    def interval_ours(item: tuple[tuple[Schedule, IntervalSpec], datetime]) -> object:
        return next_after(item[0][1], item[1])

    def fresh_utc_ours(item: tuple[tuple[Schedule, IntervalSpec], datetime]) -> object:
        return fresh_ours((item[0][0], item[1]))

    def fresh_utc_theirs(item: tuple[tuple[Schedule, IntervalSpec], datetime]) -> object:
        return fresh_theirs((item[0][0], item[1]))

    qs = questions(list(zip(utc, intervals, strict=True)), "fresh-utc", rounds)
    distinct_per_round(qs)
    check_no_memo("fresh, UTC", fresh_utc_ours, qs[-1], count)
    agree(qs[-1][:CHUNK], fresh_utc_ours, fresh_utc_theirs, zoned=False)
    timing = measure(
        qs[:-1], [timed(fresh_utc_ours), timed(fresh_utc_theirs), timed(interval_ours)]
    )
    rows.append(row(f"(a) fresh question, parsed schedule, {count} schedules, UTC", timing))
    rows.append(
        row(f"(c) fresh question, {count} intervals (vs croniter, UTC row above)", timing, ours=2)
    )

    # (b) walks: each answer is the next question.
    def walk_ours(item: tuple[tuple[Schedule, IntervalSpec], datetime]) -> None:
        spec, at = item[0][0].spec, item[1]
        for _ in range(WALK):
            at = next_after(spec, at)  # type: ignore[assignment]

    def walk_theirs(item: tuple[tuple[Schedule, IntervalSpec], datetime]) -> None:
        s = item[0][0]
        it = s.croniter
        it.set_current(item[1].astimezone(s.zone), force=True)
        for _ in range(WALK):
            it.get_next(datetime)

    def walk_interval(item: tuple[tuple[Schedule, IntervalSpec], datetime]) -> None:
        spec, at = item[0][1], item[1]
        for _ in range(WALK):
            at = next_after(spec, at)  # type: ignore[assignment]

    walkers = list(zip(zoned[:WALKERS], intervals[:WALKERS], strict=True))
    qs = questions(walkers, "walk", rounds)
    distinct_per_round(qs)
    check_no_memo("walk", walk_ours, qs[-1], len(walkers) * WALK)
    timing = measure(
        qs[:-1], [timed(walk_ours), timed(walk_theirs), timed(walk_interval)], per_item=WALK
    )
    rows.append(row(f"(b) walk {WALK} consecutive, {len(walkers)} schedules, 5 zones", timing))
    rows.append(
        row(
            f"(c) walk {WALK} consecutive, {len(walkers)} intervals (vs croniter, walk above)",
            timing,
            ours=2,
        )
    )

    keyed = [
        [
            (expr.replace(" ", "_"), after)
            for expr, after in zip(exprs, instants(count, "key"), strict=True)
        ]
    ]
    timing = measure(keyed * rounds, [timed(lambda pair: occurrence_key(*pair))])
    rows.append(row(f"occurrence_key, {count} instants", timing, against=None))
    return rows


def agree(
    items: Sequence[Item],
    ours: Callable[[Item], Any],
    theirs: Callable[[Item], Any],
    *,
    zoned: bool,
) -> None:
    """Both sides answer alike (in zones, DST changes aside: croniter's rule differs)."""
    differ = sum(ours(item) != theirs(item).astimezone(UTC) for item in items)
    if differ > (len(items) // 20 if zoned else 0):
        raise SystemExit(f"voltro_beat and croniter disagree on {differ} of {len(items)}")


def row(name: str, timing: Timing, *, ours: int = 0, against: int | None = 1) -> dict[str, object]:
    voltro = timing.best_us(ours)
    cron = None if against is None else timing.best_us(against)
    ratios = [] if against is None else timing.round_ratios(ours, against)
    return {
        "case": name,
        "calls": timing.calls,
        "voltro_us_per_call": round(voltro, 3),
        "croniter_us_per_call": None if cron is None else round(cron, 3),
        "ratio": None if cron is None else round(voltro / cron, 3),
        "ratio_per_round": [round(r, 3) for r in ratios],
        "chunk_spread_voltro": round(timing.spread(ours), 3),
        "chunk_spread_croniter": None if against is None else round(timing.spread(against), 3),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    began = time.perf_counter()
    rows = run(args.schedules, args.rounds)
    elapsed = time.perf_counter() - began
    load_after = os.getloadavg()

    print("| case | calls | voltro µs/call | croniter µs/call | ratio | ratio per round |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        cron = "" if r["croniter_us_per_call"] is None else f"{r['croniter_us_per_call']:.2f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        per_round = ", ".join(f"{x:.3f}" for x in r["ratio_per_round"])  # type: ignore[attr-defined]
        print(
            f"| {r['case']} | {r['calls']} | {r['voltro_us_per_call']:.2f} | {cron} | {ratio} "
            f"| {per_round} |"
        )
    spreads = [s for r in rows for s in (r["chunk_spread_voltro"], r["chunk_spread_croniter"]) if s]
    print(
        f"\n{args.rounds} rounds in {elapsed:.0f} s on {os.cpu_count()} CPUs; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; a chunk's slowest round took "
        f"{min(spreads):.2f}x to {max(spreads):.2f}x its fastest (median over chunks, per side)"
    )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in load_after],
                "seconds": round(elapsed, 1),
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
