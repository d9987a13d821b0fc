"""One command for the whole benchmark: ``python -m bench`` (or ``python bench/run.py``).

    .venv/bin/python -m bench --quick                  # a few minutes, smoke-sized
    .venv/bin/python -m bench                          # burst 1k/10k, steady 100/1k x 60 s
    .venv/bin/python -m bench --workloads burst --burst-sizes 10000 --repeat 3

Prints a markdown table and writes ``bench/results/<name>.json`` (and each case's logs under
``bench/results/<name>-logs/``).
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import raw, report
from bench.services import Services, ensure_database, voltro_scheduler
from bench.workloads import Case, Settings, run_case

RESULTS = Path(__file__).resolve().parent / "results"
CONTENDERS = ("celery", "redbeat", "voltro")
#: voltro_beat in ``cluster`` coordination: opt-in (``--schedulers voltro,voltro-cluster``).
CLUSTER = "voltro-cluster"
INCUMBENT_SCHEDULERS = {
    "celery": "celery.beat:PersistentScheduler",
    "redbeat": "redbeat.RedBeatScheduler",
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workloads",
        default="raw,idle,steady,burst",
        help="comma list of raw, idle, steady, burst (default: all)",
    )
    ap.add_argument(
        "--schedulers",
        default=",".join(CONTENDERS),
        help="comma list of celery, redbeat, voltro, voltro-cluster (voltro_beat in cluster"
        " coordination; default: celery, redbeat, voltro)",
    )
    ap.add_argument("--burst-sizes", type=_ints, default=[1000, 10000])
    ap.add_argument("--steady-sizes", type=_ints, default=[100, 1000])
    ap.add_argument("--idle-sizes", type=_ints, default=[10000])
    ap.add_argument("--big", action="store_true", help="add S=100,000 to burst and idle")
    ap.add_argument("--seconds", type=int, default=60, help="steady window length")
    ap.add_argument("--incumbent-replicas", type=_ints, default=[1, 2])
    ap.add_argument("--voltro-replicas", type=_ints, default=[1, 3])
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; medians are quoted")
    ap.add_argument(
        "--burst-lead",
        type=float,
        default=50.0,
        help="start beats this many seconds before the minute boundary (a later boundary is"
        " measured if they are not ready 3 s before it)",
    )
    ap.add_argument("--burst-window", type=float, default=55.0)
    ap.add_argument(
        "--burst-once",
        action="store_true",
        help="the burst's schedules fire at the measured boundary's minute of the hour only"
        " (crontab(minute=M)), not every minute: a burst of S with no earlier boundary of S"
        " during the lead (at a million, every minute is 16,700 occurrences a second)",
    )
    ap.add_argument(
        "--voltro-store",
        default=Services.voltro_store,
        help="voltro_beat store URL (PostgreSQL bench database or sqlite:///path)",
    )
    ap.add_argument("--loglevel", default="warning", help="beat log level (all contenders)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: S=1000 burst (20 s window), S=100 steady 10 s, R=1 only",
    )
    ap.add_argument("--name", default=time.strftime("bench-%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    if args.quick:
        args.burst_sizes, args.steady_sizes, args.idle_sizes = [1000], [100], [1000]
        args.seconds, args.burst_window, args.burst_lead = 10, 20.0, 30.0
        args.incumbent_replicas = args.voltro_replicas = [1]
    if args.big:
        args.burst_sizes = sorted({*args.burst_sizes, 100_000})
        args.idle_sizes = sorted({*args.idle_sizes, 100_000})
    return args


def plan(args: argparse.Namespace, contenders: list[str]) -> list[Case]:
    workloads = args.workloads.split(",")
    cases: list[Case] = []
    sizes = {"idle": args.idle_sizes, "steady": args.steady_sizes, "burst": args.burst_sizes}
    for workload in ("idle", "steady", "burst"):
        if workload not in workloads:
            continue
        for size in sizes[workload]:
            for name in contenders:
                ours = name in ("voltro", CLUSTER)
                reps = args.voltro_replicas if ours else args.incumbent_replicas
                for r in [1] if workload == "idle" else reps:
                    cases.append(Case(workload, name, size, r))
    return cases


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every ``finally`` stops the processes it started and the
    # finished cases are still reported; SIGINT is re-armed because a shell starts background
    # jobs with it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    svc = Services(voltro_store=args.voltro_store)
    ensure_database(svc)

    schedulers = dict(INCUMBENT_SCHEDULERS)
    skipped: dict[str, str] = {}
    wanted = [c for c in args.schedulers.split(",") if c]
    for name in ("voltro", CLUSTER):
        if name not in wanted:
            continue
        value, how = voltro_scheduler()
        if value is None:
            skipped[name] = how
            print(f"SKIP {name}: {how}", flush=True)
        else:
            schedulers[name] = value
            print(f"{name}: -S {value} ({how})", flush=True)
    contenders = [c for c in wanted if c in schedulers]

    RESULTS.mkdir(exist_ok=True)
    out_path = RESULTS / f"{args.name}.json"
    cfg = Settings(
        svc=svc,
        schedulers=schedulers,
        loglevel=args.loglevel,
        burst_lead=args.burst_lead,
        burst_window=args.burst_window,
        burst_once=args.burst_once,
        steady_seconds=args.seconds,
        logs=RESULTS / f"{args.name}-logs",
    )
    doc: dict[str, Any] = {
        "name": args.name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.executable).name, "-m", "bench", *(argv or sys.argv[1:])]),
        "host": {"cpus": _cpus(), "python": platform.python_version(), **_versions()},
        "settings": {k: v for k, v in vars(args).items()},
        "skipped": skipped,
        "raw": None,
        "runs": [],
        "errors": {},
    }

    def save() -> None:
        out_path.write_text(json.dumps(doc, indent=1, default=str))

    cases = plan(args, contenders)
    by_case: dict[Case, list[dict[str, Any]]] = {}
    try:
        if "raw" in args.workloads.split(","):
            print("raw limits ...", flush=True)
            doc["raw"] = raw.run(svc, args.quick)
            save()
        for k in range(args.repeat):
            for n, case in enumerate(cases, 1):
                print(f"[{k + 1}/{args.repeat} {n}/{len(cases)}] {case.label} ...", flush=True)
                try:
                    figures = run_case(case, cfg)
                except Exception as exc:  # one broken case must not lose the others
                    doc["errors"][f"{case.label}#{k + 1}"] = f"{type(exc).__name__}: {exc}"
                    print(f"    FAILED: {exc}", flush=True)
                    save()
                    continue
                print("    " + json.dumps(figures), flush=True)
                by_case.setdefault(case, []).append(figures)
                doc["runs"].append({"case": case.__dict__, "repeat": k + 1, "figures": figures})
                save()
    except KeyboardInterrupt:
        # The case's processes are already stopped; report what was measured so far.
        doc["errors"]["interrupted"] = "Ctrl-C or SIGTERM: the remaining cases did not run"
        print("\ninterrupted: reporting the cases that finished", flush=True)
    medians = {case: report.median(runs) for case, runs in by_case.items()}
    doc["medians"] = [{"case": c.__dict__, "figures": f} for c, f in medians.items()]
    doc["ratios"] = report.ratios(medians)
    save()
    print()
    print(report.markdown(medians, doc["raw"], skipped, doc["errors"]))
    print(f"\nJSON: {out_path}")
    return 1 if doc["errors"] else 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("celery", "kombu", "redis", "celery-redbeat", "psycopg"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


if __name__ == "__main__":
    raise SystemExit(main())
