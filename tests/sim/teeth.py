"""``python -m tests.sim.teeth``: the simulation's teeth. Each finding of the exactly-once issue
(issue 18) that the model covers, its fix reverted in a scratch copy of the package; the
simulation then runs seeds 1, 2, ... until one fails, and says which and how many it took.

    .venv/bin/python -m tests.sim.teeth                 # every mutant, up to 400 seeds each
    .venv/bin/python -m tests.sim.teeth --only 1 --max 100

The reverts are textual (a fix's lines replaced by what they were before, in today's code):
each must still apply, or the run says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: (finding, what the fix was, [(file, today's text, the reverted text)]).
MUTANTS: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    (
        "1",
        "a failed mark keeps the chunk written meanwhile for the next try",
        [
            (
                "voltro_beat/dispatch.py",
                "                        self._keep(self.unmarked, sent)"
                "  # its mark was never tried\n",
                "",
            )
        ],
    ),
    (
        "2",
        "a chunk is written only while a whole publish timeout of its lease is left "
        "(the fence leases 1.25 timeouts)",
        [
            (
                "voltro_beat/dispatch.py",
                "        self.hold = lease + lease / 4\n",
                "        self.hold = lease\n",
            ),
            (
                "voltro_beat/dispatch.py",
                "        return fenced.held_until - latest >= self.lease\n",
                "        return True\n",
            ),
        ],
    ),
    (
        "3",
        "messages the broker refused are given back to recovery, not marked",
        [
            (
                "voltro_beat/dispatch.py",
                "            refused = self.publisher.publish(messages)\n",
                "            self.publisher.publish(messages)\n",
            )
        ],
    ),
    (
        "4",
        "SIGTERM during a broker write waits until its mark is under way",
        [
            (
                "voltro_beat/dispatch.py",
                "                with self.runner.hold_signals(), self._renewing(",
                "                with self._renewing(",
            )
        ],
    ),
    (
        "5",
        "a sweep of the runs raises a watermark; claims of older occurrences are refused",
        [
            (
                "voltro_beat/store/sqlite.py",
                "            if floor is not None:  # see BeatStore.delete_expired\n",
                "            if False:  # noqa\n",
            )
        ],
    ),
    (
        "6",
        "occurrences yielded to a newest replica that died are recorded missed (yielded)",
        [
            (
                "voltro_beat/engine/gate.py",
                "            for at in p.instants\n        ]\n",
                "            for at in p.instants\n            if p.entry.name not in yielded\n"
                "        ]\n",
            )
        ],
    ),
    (
        "7",
        "a chunk is written once the earliest the database's clock can read reached its instant",
        [
            (
                "voltro_beat/dispatch.py",
                "        earliest, _ = self.clock.bounds(fenced.reading)\n",
                "        earliest = self.clock.now()\n",
            )
        ],
    ),
    (
        "8",
        "occurrences less than a lease old at boot are published whatever the catch-up policy "
        "(and, since this issue, nothing that fell while a live replica ran its schedule)",
        [
            (
                "voltro_beat/catchup.py",
                "    recent = sum(1 for at in down if at > now - on_time)\n",
                "    recent = 0\n",
            ),
            (
                "voltro_beat/catchup.py",
                "    down = [\n        at\n        for at in instants\n"
                "        if (live_since is None or at < live_since)"
                " and (live_until is None or at > live_until)\n"
                "    ]\n",
                "    down = instants\n",
            ),
        ],
    ),
]


def mutate(scratch: Path, changes: list[tuple[str, str, str]]) -> None:
    for path, before, after in changes:
        target = scratch / path
        text = target.read_text()
        if before not in text:
            raise SystemExit(f"the revert does not apply any more: {path}: {before.strip()!r}")
        target.write_text(text.replace(before, after, 1))


def run(finding: str, changes: list[tuple[str, str, str]], most: int, jobs: int) -> str:
    scratch = Path(tempfile.mkdtemp(prefix=f"voltro-teeth-{finding}-"))
    try:
        shutil.copytree(ROOT / "voltro_beat", scratch / "voltro_beat")
        shutil.copytree(
            ROOT / "tests", scratch / "tests", ignore=shutil.ignore_patterns("__pycache__")
        )
        mutate(scratch, changes)
        env = {**os.environ, "PYTHONPATH": str(scratch)}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.sim",
                "--seeds",
                str(most),
                "--jobs",
                str(jobs),
                "--until-failure",
            ],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
        )
        return done.stdout
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.teeth")
    parser.add_argument("--only", action="append", help="a finding's number (repeatable)")
    parser.add_argument("--max", type=int, default=400, help="seeds per mutant at most")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    for finding, fix, changes in MUTANTS:
        if args.only and finding not in args.only:
            continue
        print(f"## finding {finding}: {fix} (reverted)", flush=True)
        print(run(finding, changes, args.max, args.jobs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
