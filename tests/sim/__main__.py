"""``python -m tests.sim``: run the simulation over many seeds, or replay one.

    python -m tests.sim --seeds 10000 --jobs 2     # the long mode: seeds 1..10000
    python -m tests.sim --seeds 200 --first 5000   # seeds 5000..5199
    python -m tests.sim --seed 1234                # replay one seed, with its trace
    python -m tests.sim --budget 180               # fresh random seeds for 180 s (CI)
    python -m tests.sim --seeds 500 --claim-batch 4 # bursts claimed over several steps

Prints a summary (seeds, steps, faults injected by kind, a digest of what the seeds did,
violations); for each failing seed the violations, a minimal trace (the events of the first
violation's occurrence and the faults) and the command that replays it. Exits 1 if any seed
failed. Ctrl-C (SIGINT) ends a run of ``--seeds`` at the next seed done, with the summary of
the seeds it ran (``--first`` then resumes it).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import multiprocessing
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.sim.scenario import Result, simulate
from voltro_beat.engine import recorder

#: Occurrences per claim statement and step, as the engine has it (``--claim-batch``).
DEFAULT_BATCH = recorder.BATCH

#: Trace events shown for every failing seed, whatever occurrence they concern.
FAULT_KINDS = {"killed", "paused", "sigterm", "boots", "exited", "crash", "requeues", "fault"}


@dataclass
class Summary:
    seeds: int = 0
    steps: int = 0
    occurrences: int = 0
    deliveries: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    failed: list[Result] = field(default_factory=list)
    wall: float = 0.0
    #: Of every seed's trace and step count, in the order added: two commits that behave
    #: alike under simulation print the same for the same ``--seeds`` (a change meant to
    #: alter no behaviour, a refactoring, a speed-up, can be checked with it).
    behaviour: Any = field(default_factory=hashlib.sha1)

    def add(self, result: Result) -> None:
        self.behaviour.update(f"{result.seed} {result.steps}\n".encode())
        for event in result.trace:
            self.behaviour.update(f"{event}\n".encode())
        self.seeds += 1
        self.steps += result.steps
        self.occurrences += result.occurrences
        self.deliveries += result.deliveries
        self.faults.update(result.faults)
        self.violations.update(v.kind for v in result.violations)
        if result.crashes:
            self.violations["crash"] += len(result.crashes)
        if not result.ok:
            self.failed.append(result)


def minimal_trace(result: Result, limit: int = 60) -> list[str]:
    """The events of the first violation's occurrence, and the faults around them."""
    key = result.violations[0].key if result.violations else None
    lines = [
        str(e)
        for e in result.trace
        if (key is not None and key in e.keys)
        or (e.kind in FAULT_KINDS and not e.detail.startswith("statement failed"))
    ]
    if len(lines) > limit:
        cut = f"   ... {len(lines) - limit} more ..."
        lines = [*lines[: limit // 2], cut, *lines[-limit // 2 :]]
    return lines


def report(result: Result, *, trace: bool = True) -> str:
    out = [
        f"seed {result.seed}: {len(result.violations)} violations, {len(result.crashes)} crashes"
    ]
    out += [f"  {v}" for v in result.violations[:10]]
    if len(result.violations) > 10:
        out.append(f"  ... {len(result.violations) - 10} more")
    out += [f"  crash: {c}" for c in result.crashes[:3]]
    if trace:
        out.append("  trace:")
        out += [f"    {line}" for line in minimal_trace(result)]
    batch = f" --claim-batch {recorder.BATCH}" if recorder.BATCH != DEFAULT_BATCH else ""
    out.append(f"  replay: .venv/bin/python -m tests.sim --seed {result.seed}{batch}")
    return "\n".join(out)


def _one(seed: int) -> Result:
    return simulate(seed)


def run(args: argparse.Namespace) -> Summary:
    summary = Summary()
    started = time.monotonic()
    if args.seed is not None:
        _tally(summary, _one(args.seed), args)
    elif args.budget is not None:
        # Fresh seeds, a batch of one per job at a time, until the budget is spent.
        rng = random.SystemRandom()
        end = started + args.budget
        with _pool(args.jobs) as pool:
            while time.monotonic() < end:
                batch = [rng.randrange(1, 2**31) for _ in range(args.jobs)]
                for result in pool.map(_one, batch):
                    _tally(summary, result, args)
    else:
        seeds = range(args.first, args.first + args.seeds)
        # Ctrl-C (SIGINT) ends a long run at the next seed done, with the summary of the seeds
        # it finished (the workers ignore it: they finish their seed or are stopped).
        stop: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.append(signum))
        try:
            with _pool(args.jobs) as pool:
                # In order, so that --until-failure says how many seeds it took, and an
                # interrupted run which seeds it ran.
                for result in pool.imap(_one, seeds, chunksize=1):
                    _tally(summary, result, args)
                    if args.until_failure and not result.ok:
                        print(f"the first failing seed: {result.seed} ({summary.seeds} seeds run)")
                        break
                    if stop:
                        last = args.first + summary.seeds - 1
                        print(f"interrupted: seeds {args.first}..{last} ran", flush=True)
                        break
        finally:
            signal.signal(signal.SIGINT, previous)
    summary.wall = time.monotonic() - started
    return summary


def _pool(jobs: int) -> Any:
    # Fresh worker processes now and then: nothing one run leaves behind can build up.
    return multiprocessing.get_context("fork").Pool(
        jobs,
        initializer=signal.signal,
        initargs=(signal.SIGINT, signal.SIG_IGN),
        maxtasksperchild=50,
    )


def _tally(summary: Summary, result: Result, args: argparse.Namespace) -> None:
    summary.add(result)
    if not result.ok:
        print(report(result, trace=True), flush=True)
    elif args.seed is not None and args.trace:
        print("\n".join(str(e) for e in result.trace))
    if args.progress and summary.seeds % args.progress == 0:
        print(
            f"... {summary.seeds} seeds, {len(summary.failed)} failed",
            file=sys.stderr,
            flush=True,
        )


def print_summary(summary: Summary) -> None:
    wall = summary.wall
    print(
        f"seeds {summary.seeds}, steps {summary.steps:,}, occurrences published "
        f"{summary.occurrences:,}, deliveries {summary.deliveries:,}, wall {wall:.1f} s"
    )
    print("faults injected (seeds with each kind):")
    for kind, n in sorted(summary.faults.items()):
        print(f"  {kind:<28} {n}")
    print(f"behaviour digest: {summary.behaviour.hexdigest()[:16]}")
    print(f"violations: {sum(summary.violations.values())}")
    for kind, n in sorted(summary.violations.items()):
        print(f"  {kind:<28} {n}")
    if summary.failed:
        print("failing seeds: " + " ".join(str(r.seed) for r in summary.failed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--budget", type=float, help="fresh random seeds for this many seconds")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trace", action="store_true", help="with --seed: the whole trace")
    parser.add_argument("--progress", type=int, default=0, help="a line every N seeds")
    parser.add_argument("--log", action="store_true", help="show voltro_beat's own log")
    parser.add_argument(
        "--until-failure", action="store_true", help="stop at the first failing seed"
    )
    parser.add_argument(
        "--claim-batch",
        type=int,
        help="occurrences per claim statement and step (the engine's is 10,000, more than a "
        "simulated step has): smaller, a burst is claimed over several steps",
    )
    args = parser.parse_args(argv)
    if args.claim_batch:
        recorder.BATCH = args.claim_batch
    if not args.log:
        logging.disable(logging.CRITICAL)
    summary = run(args)
    print_summary(summary)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
