"""The main job: several ``celery beat -S voltro`` replicas and a worker, then the run table.

    ./run demo                                   # SQLite store, filesystem broker: no server
    ./run demo --store postgresql+psycopg://root@127.0.0.1:5432/test --broker redis://127.0.0.1:6379/0

Every occurrence should appear once in the run table, won by one of the replicas, and have
run once on the worker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
console = Console(width=max(Console().width, 100))
#: The filesystem broker has no fanout exchanges: no worker-to-worker chatter.
WORKER_FLAGS = ("--without-mingle", "--without-gossip", "--without-heartbeat")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store URL (default: a SQLite file in demo-run/)")
    parser.add_argument("--broker", default="filesystem://", help="Celery broker URL")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()

    work = HERE.parent / "demo-run"
    work.mkdir(exist_ok=True)
    store = args.store or f"sqlite:///{work / 'voltro-demo.sqlite3'}"
    broker_folder = work / "broker"
    broker_folder.mkdir(exist_ok=True)
    _reset(store, broker_folder)
    env = dict(
        os.environ,
        PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        VOLTRO_BEAT_STORE_URL=store,
        DEMO_BROKER_URL=args.broker,
        DEMO_BROKER_FOLDER=str(broker_folder),
    )
    celery = [sys.executable, "-m", "celery", "-A", "demo_app"]
    #: Each process started, and its log.
    procs: dict[subprocess.Popen[bytes], Path] = {}
    try:
        _start(
            procs,
            [*celery, "worker", "-P", "prefork", "-c", "2", "-l", "info", *WORKER_FLAGS],
            env,
            work / "worker.log",
        )
        for n in range(1, args.replicas + 1):
            beat_env = dict(env, VOLTRO_BEAT_REPLICA=f"replica-{n}")
            schedule = str(work / f"celerybeat-{n}")
            _start(
                procs,
                [*celery, "beat", "-S", "voltro", "-l", "info", "-s", schedule],
                beat_env,
                work / f"replica-{n}.log",
            )
        console.print(
            f"[bold]voltro_beat demo[/]: {args.replicas} beat replicas + 1 worker, "
            f"store {store}, broker {args.broker}; running {args.seconds:.0f} s "
            f"(logs in {work})"
        )
        # Count the run time from when every replica is up: starting Python and Celery can
        # take seconds on a busy machine.
        logs = [work / f"replica-{n}.log" for n in range(1, args.replicas + 1)]
        booted = _watch(procs, 120, lambda: all("beat: Starting" in _text(f) for f in logs))
        if not booted or not _watch(procs, args.seconds, lambda: False):
            return 1
        beats = list(procs)[1:]
        for p in beats:
            p.send_signal(signal.SIGTERM)
        _wait(beats)
        time.sleep(3)  # let the worker finish what the beats sent last
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        _wait(list(procs))
    return _report(store)


def _watch(
    procs: dict[subprocess.Popen[bytes], Path], seconds: float, done: Callable[[], bool]
) -> bool:
    """Wait ``seconds`` or until ``done()``; False if a process died meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not done():
        for p, log in procs.items():
            if p.poll() is not None:
                console.print(
                    f"[red]a process exited early (code {p.returncode}); its log, {log}:[/]"
                )
                console.print("\n".join(_text(log).splitlines()[-20:]), markup=False)
                return False
        time.sleep(0.2)
    return True


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _start(
    procs: dict[subprocess.Popen[bytes], Path], cmd: list[str], env: dict[str, str], log: Path
) -> None:
    """Start ``cmd`` with its output in ``log``; add it to ``procs``."""
    with log.open("wb") as out:
        procs[subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)] = log


def _wait(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _reset(store: str, broker_folder: Path) -> None:
    engine = sa.create_engine(store)
    with engine.begin() as conn:
        for table in ("_voltro_schedule_runs", "_voltro_schedule_claims", "demo_executions"):
            if sa.inspect(conn).has_table(table):
                conn.execute(sa.text(f"DELETE FROM {table}"))
    engine.dispose()
    # Messages, and the folder kombu keeps for broadcast (control) messages.
    shutil.rmtree(broker_folder)
    broker_folder.mkdir()


def _report(store: str) -> int:
    engine = sa.create_engine(store)
    with engine.connect() as conn:
        runs = conn.execute(
            sa.text(
                "SELECT id, replica, coordination_outcome, status, scheduled_at, published_at "
                "FROM _voltro_schedule_runs ORDER BY scheduled_at, id"
            )
        ).all()
        executed = Counter(
            row[0] for row in conn.execute(sa.text("SELECT occurrence FROM demo_executions")).all()
        )
    table = Table(title="_voltro_schedule_runs")
    for column in ("occurrence", "won by", "outcome", "status", "executions"):
        table.add_column(column, no_wrap=True)
    for key, replica, outcome, status, _at, _published in runs:
        table.add_row(key, replica, outcome, status, str(executed.get(key, 0)))
    console.print(table)
    wins = Counter(row[1] for row in runs)
    twice = [k for k, n in executed.items() if n > 1]
    console.print(
        f"{len(runs)} occurrences; won by "
        + ", ".join(f"{r}: {n}" for r, n in sorted(wins.items()))
        + f"; executed more than once: {len(twice)}"
    )
    return 1 if twice or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
