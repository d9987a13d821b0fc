"""Benchmark: boot cost of schedule parsing and the occurrence maths at 1,000-100,000 schedules.

    .venv/bin/python bench/boot.py [--sizes 1000,10000,100000] [--repeat 3] [--against DIR]

What the scheduler does at boot, timed step by step in a fresh process per run (so no cache
survives from one run to the next), for two shapes of ``beat_schedule``:

* ``identical``: S entries, each its own ``crontab(minute='*')`` (the burst workload);
* ``distinct``: S entries over 1,000 distinct cron strings (entry i uses string i % 1,000).

Steps: ``parse`` = ``parse_entries``; ``cadence`` = ``cadence(spec)`` per entry (the scheduler's
claims grace); ``first`` = ``next_after(spec, now)`` per entry (the heap at boot); ``advance``
= ``next_after(spec, first)`` per entry (what each schedule costs once it has fired). ``boot``
= parse + cadence + first. Building the app's ``beat_schedule`` (Celery's ``crontab``
constructor) is the application's cost and is not included. Memory: ``peak MB`` = the
process's peak RSS (``ru_maxrss``), ``growth MB`` = RSS after the steps minus RSS before them
(the entries, specs and caches kept alive; the schedule dict itself is built before).

``--against DIR`` runs every case also with the ``voltro_beat`` package found in ``DIR`` (e.g.
an export of an older commit: ``git archive HEAD voltro_beat | tar -x -C DIR``), the two sides
alternating run by run, so machine load hits both alike. Prints markdown tables (medians, and
the spread of the runs) and writes ``bench/results/boot.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "boot.json"
NOW = datetime(2024, 5, 14, 10, 17, 23, 456_789, tzinfo=UTC)
SHAPES = ("identical", "distinct")
DISTINCT = 1000
STEPS = ("parse", "cadence", "first", "advance")
DAYS_OF_WEEK = ["*", "1-5", "0,6", "1", "3", "5", "2,4"]


def distinct_expressions(count: int) -> list[str]:
    """``count`` distinct cron strings of several kinds, the same in every run."""
    kinds = [f"*/{step} * * * *" for step in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)]
    kinds += [f"{m} * * * {dow}" for m in range(60) for dow in DAYS_OF_WEEK]
    kinds += [f"{m} {h} * * {dow}" for dow in DAYS_OF_WEEK for h in range(24) for m in range(60)]
    picked = kinds[:11] + random.Random(0).sample(kinds[11:], count - 11)
    assert len(set(picked)) == count
    return picked


def build_schedule(shape: str, count: int) -> dict[str, dict[str, Any]]:
    if shape == "identical":
        from celery.schedules import crontab

        return {
            f"s{i:06d}": {"task": "bench.noop", "schedule": crontab(minute="*"), "args": [i]}
            for i in range(count)
        }
    exprs = distinct_expressions(DISTINCT)
    return {
        f"s{i:06d}": {"task": "bench.noop", "schedule": exprs[i % DISTINCT], "args": [i]}
        for i in range(count)
    }


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(shape: str, count: int, src: str | None) -> dict[str, Any]:
    """One run in this (fresh) process; returns the figures."""
    if src:
        sys.path.insert(0, src)
    import voltro_beat
    from voltro_beat import cron
    from voltro_beat.occurrences import next_after
    from voltro_beat.schedules import cadence, parse_entries

    schedule = build_schedule(shape, count)
    gc.collect()
    rss_before = _rss_mb()
    seconds: dict[str, float] = {}

    start = time.perf_counter()
    entries = parse_entries(schedule, tz=None, max_lateness=timedelta(days=1))
    seconds["parse"] = time.perf_counter() - start

    start = time.perf_counter()
    graces = [cadence(entry.spec) for entry in entries]
    seconds["cadence"] = time.perf_counter() - start

    start = time.perf_counter()
    firsts = [next_after(entry.spec, NOW) for entry in entries]
    seconds["first"] = time.perf_counter() - start

    start = time.perf_counter()
    seconds_ = [next_after(entry.spec, at) for entry, at in zip(entries, firsts, strict=True) if at]
    seconds["advance"] = time.perf_counter() - start

    gc.collect()
    rss_after = _rss_mb()
    cache = cron._states.by_spec
    result = {
        "package": str(Path(voltro_beat.__file__).parent),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "boot": round(seconds["parse"] + seconds["cadence"] + seconds["first"], 4),
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "growth_mb": round(rss_after - rss_before, 1),
        "distinct_specs": len({entry.spec for entry in entries}),
        "spec_objects": len({id(entry.spec) for entry in entries}),
        "cron_cache_entries": len(cache),
        "firsts": len(firsts),
    }
    del graces, seconds_
    return result


def run_child(shape: str, count: int, src: str | None, timeout: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", shape, str(count)]
    if src:
        command += ["--src", src]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).parent
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def spread(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
        }

    out = {step: spread([r["seconds"][step] for r in runs]) for step in STEPS}
    out["boot"] = spread([r["boot"] for r in runs])
    out["peak_mb"] = spread([r["peak_mb"] for r in runs])
    out["growth_mb"] = spread([r["growth_mb"] for r in runs])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", help="also run with the voltro_beat package in this dir")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("SHAPE", "S"), help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.src)))
        return

    sides: list[tuple[str, str | None]] = [("current", None)]
    if args.against:
        sides.append(("against", str(Path(args.against).resolve())))
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    cases = []
    for count in sizes:
        for shape in shapes:
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
            for r in range(args.repeat):
                order = sides if r % 2 == 0 else sides[::-1]
                for label, src in order:
                    found = run_child(shape, count, src, args.timeout)
                    runs[label].append(found)
                    print(
                        f"  {shape} S={count} {label} run {r + 1}: boot {found['boot']:.3f} s"
                        f" {found['seconds']} peak {found['peak_mb']} MB",
                        file=sys.stderr,
                        flush=True,
                    )
            for label, _ in sides:
                cases.append(
                    {
                        "shape": shape,
                        "schedules": count,
                        "side": label,
                        "package": runs[label][0]["package"],
                        "distinct_specs": runs[label][0]["distinct_specs"],
                        "spec_objects": runs[label][0]["spec_objects"],
                        "cron_cache_entries": runs[label][0]["cron_cache_entries"],
                        **summarise(runs[label]),
                        "runs": runs[label],
                    }
                )

    print(
        "| shape | S | side | parse s | cadence s | first s | advance s | boot s"
        " | boot min-max | peak MB | growth MB |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for c in cases:
        print(
            f"| {c['shape']} | {c['schedules']:,} | {c['side']} "
            + "".join(f"| {c[step]['median']:.3f} " for step in STEPS)
            + f"| {c['boot']['median']:.3f} | {c['boot']['min']:.3f}-{c['boot']['max']:.3f} "
            f"| {c['peak_mb']['median']:.0f} | {c['growth_mb']['median']:.0f} |"
        )
    for label, src in sides:
        print(f"\n{label}: voltro_beat from {src or 'this checkout'}")

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "load_average": os.getloadavg(),
                "now": NOW.isoformat(),
                "repeat": args.repeat,
                "cases": cases,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
