"""What a recovery sweep's take-over costs with many schedules known.

    .venv/bin/python -m bench.recovery                          # 1,000,000 schedules known
    .venv/bin/python -m bench.recovery --schedules 100000 --lapsed 5000

One replica claims ``--lapsed`` runs (one per schedule, a short lease) on the local PostgreSQL
(database ``voltro_recovery``, recreated); once their leases ran out another replica takes them
over a chunk (1,000) at a time, as its recovery sweep does, knowing ``--schedules`` schedules
(a replica's share of a million in cluster coordination, say). Prints the time per chunk. The
sweep runs no faster than its take-over statement: at a million schedules each chunk's
statement used to carry every name. Writes ``bench/results/recovery.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from voltro_beat.coordination import Coordination
from voltro_beat.dispatch import CHUNK
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = "voltro_recovery"
SERVER = "postgresql+psycopg://root@127.0.0.1:5432"
#: Runs claimed per statement while setting up.
SETUP_BATCH = 5_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("--schedules", type=int, default=1_000_000, help="schedules known")
    parser.add_argument("--lapsed", type=int, default=20_000, help="runs to take over")
    args = parser.parse_args(argv)
    admin = sa.create_engine(f"{SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {DATABASE}"))
        conn.execute(sa.text(f"CREATE DATABASE {DATABASE}"))
    admin.dispose()
    url = f"{SERVER}/{DATABASE}"
    holder = BeatStore(Database.open(url), replica="holder")
    holder.database.upgrade()
    taker = BeatStore(Database.open(url), replica="taker")
    at = datetime.now(UTC).replace(microsecond=0)
    names = [f"s-{n:07d}" for n in range(args.schedules)]
    runs = [Run(Occurrence.of(name, at), "bench.task") for name in names[: args.lapsed]]
    for start in range(0, len(runs), SETUP_BATCH):
        holder.claim(
            runs[start : start + SETUP_BATCH],
            coordination=Coordination.ADVISORY_LOCK,
            lease=timedelta(milliseconds=100),
        )
    time.sleep(0.5)
    known = dict.fromkeys(names).keys()
    took, chunks = 0, 0
    started = time.perf_counter()
    while taken := taker.take_over(schedules=known, hold=timedelta(minutes=5), limit=CHUNK):
        took += len(taken)
        chunks += 1
    elapsed = time.perf_counter() - started
    figures = {
        "schedules_known": args.schedules,
        "runs_taken_over": took,
        "chunks": chunks,
        "ms_per_chunk": round(elapsed / max(1, chunks) * 1000, 1),
        "runs_per_second": round(took / elapsed),
    }
    print("| schedules known | runs taken over | chunks | ms a chunk | runs/s |")
    print("|---|---|---|---|---|")
    print(
        f"| {args.schedules:,} | {took:,} | {chunks} | {figures['ms_per_chunk']:g} |"
        f" {figures['runs_per_second']:,} |"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "recovery.json").write_text(json.dumps(figures, indent=2) + "\n")
    holder.close()
    taker.close()
    return 0 if took == len(runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
