"""The scheduler workloads: one case = one scheduler, S schedules, R replicas, real processes.

- ``burst``: S ``crontab(minute='*')`` entries (with ``burst_once``, ``crontab(minute=M)``, M
  the measured boundary's minute), beats started ``lead`` s before a minute
  boundary (a later one if they are not ready 3 s before it); from the boundary: first and
  last message, when all S had arrived, how many of S arrived within ``window`` s, duplicates.
- ``steady``: S one-second interval entries; after every replica booted and a warm-up, a window
  of D whole seconds: achieved vs expected firings, duplicates, misses, publish lag.
- ``idle``: S entries never due during the run, one replica: boot time, resident memory, and
  the CPU it uses while nothing is due.

Every case also records CPU seconds per 1,000 messages, peak RSS and boot time of its replicas
(boot = process spawn to Celery's ``beat_init`` signal; ready = spawn to the end of the first
tick; both marks are written by the generated app module, see ``appgen``).
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench import observer
from bench.appgen import write_app
from bench.observer import Message
from bench.procs import Processes
from bench.services import Services, clean, pg_transactions, python_path


@dataclass(frozen=True)
class Case:
    workload: str  # burst | steady | idle
    contender: str  # celery | redbeat | voltro | voltro-cluster
    size: int
    replicas: int

    @property
    def label(self) -> str:
        return f"{self.workload}-{self.contender}-S{self.size}-R{self.replicas}"


@dataclass(frozen=True)
class Settings:
    svc: Services
    schedulers: dict[str, str]  # contender -> the ``-S`` value
    loglevel: str = "warning"
    burst_lead: float = 50.0
    burst_window: float = 55.0
    #: The burst's schedules fire at the measured boundary's minute only (``--burst-once``).
    burst_once: bool = False
    steady_seconds: int = 60
    steady_warmup: float = 5.0
    steady_tail: float = 2.0
    idle_settle: float = 5.0
    #: Seconds over which an idle replica's CPU is measured, after ``idle_settle``.
    idle_window: float = 20.0
    boot_timeout: float = 300.0
    logs: Path | None = None  # where each case's logs are copied


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _occurrence_instant(key: str) -> float:
    """Scheduled instant of a voltro occurrence key ``name@YYYY-mm-ddTHH:MM:SS[.fff]`` (UTC)."""
    stamp = key.rsplit("@", 1)[1]
    return datetime.fromisoformat(stamp + "+00:00").timestamp()


def _replica_figures(procs: Processes) -> dict[str, Any]:
    def slowest(event: str) -> float | None:
        spans = [t - b.spawned for b in procs.beats if (t := b.mark_time(event)) is not None]
        return _round(max(spans, default=None), 3)

    return {
        "boot_s": slowest("beat_init"),
        "ready_s": slowest("first_tick"),
        "peak_rss_mb": round(max(b.sample.peak_rss for b in procs.beats) / 2**20, 1),
    }


def _wait_ready(case: Case, cfg: Settings, procs: Processes) -> float:
    """Wait until every replica sent beat_init and one finished a tick; the latest mark."""
    if not procs.wait_booted(cfg.boot_timeout):
        raise RuntimeError(f"{case.label}: a replica did not boot; see its beat.log")
    # A RedBeat standby never ticks (it waits on the lock): one ticking replica is enough.
    deadline = time.time() + cfg.boot_timeout
    while not any(b.mark_time("first_tick") for b in procs.beats):
        if time.time() > deadline:
            raise RuntimeError(f"{case.label}: no replica finished a tick; see beat.log")
        time.sleep(0.05)
    return max(b.last_mark() or 0.0 for b in procs.beats)


def _cpu_per_1k(cpu: float, messages: int) -> float | None:
    return round(cpu / messages * 1000, 3) if messages else None


def run_case(case: Case, cfg: Settings) -> dict[str, Any]:
    """Run one case from a clean slate and return its figures; every process is stopped."""
    svc = cfg.svc
    clean(svc)
    kind = {"burst": "burst", "steady": "steady", "idle": "idle"}[case.workload]
    with tempfile.TemporaryDirectory(prefix="voltro-bench-") as tmp:
        work = Path(tmp)
        write_app(work, svc, kind, case.size)
        env = {
            "PYTHONPATH": python_path(work),
            "PYTHONUNBUFFERED": "1",
            "VOLTRO_BEAT_STORE_URL": svc.voltro_store,
        }
        if case.contender == "voltro-cluster":
            env["VOLTRO_BEAT_COORDINATION"] = "cluster"
        voltro = case.contender.startswith("voltro")
        xacts0 = pg_transactions(svc) if voltro else None
        load0 = os.getloadavg()[0]
        try:
            with Processes(work) as procs:
                runner = {"burst": _burst, "steady": _steady, "idle": _idle}[case.workload]
                result = runner(case, cfg, procs, env, work)
                result.update(_replica_figures(procs))
        finally:
            if cfg.logs is not None:
                dest = cfg.logs / case.label
                dest.mkdir(parents=True, exist_ok=True)
                for log in work.rglob("*.log"):
                    shutil.copy(log, dest / f"{log.parent.name}-{log.name}")
    # Other work on the machine skews every figure: record how busy it was.
    result["loadavg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    if xacts0 is not None:
        time.sleep(1.0)  # backends flush their statistics when they exit
        xacts1 = pg_transactions(svc)
        result["db_xacts"] = None if xacts1 is None else xacts1[0] - xacts0[0] - 1
    clean(svc)
    return result


def _spawn_beats(case: Case, cfg: Settings, procs: Processes, env: dict[str, str]) -> None:
    for r in range(case.replicas):
        procs.spawn_beat(f"r{r}", cfg.schedulers[case.contender], cfg.loglevel, env)


def _burst(
    case: Case, cfg: Settings, procs: Processes, env: dict[str, str], work: Path
) -> dict[str, Any]:
    boundary = math.ceil((time.time() + cfg.burst_lead) / 60) * 60
    if cfg.burst_once:
        env = {**env, "BENCH_BURST_MINUTE": str(time.gmtime(boundary).tm_min)}
    _sleep_until(boundary - cfg.burst_lead)
    spawned = time.time()
    _spawn_beats(case, cfg, procs, env)
    ready = _wait_ready(case, cfg, procs)
    crossed = 0
    if ready > boundary - 3 and not cfg.burst_once:
        # Booted too late for the planned boundary: measure the next one it can make, and say
        # how many boundaries passed while it booted (their messages are counted as early).
        # With burst_once the planned one is measured whatever: the next has no burst.
        crossed = math.floor(ready / 60) - math.floor(spawned / 60)
        boundary = math.ceil((ready + 3) / 60) * 60
    earlier = _drop_queue(cfg.svc)
    out = work / "arrivals.json"
    obs = observer.start(procs, cfg.svc.broker_url, cfg.svc.queue, boundary + cfg.burst_window, out)
    # The store's work for the burst: from before its claims ahead (a few seconds at 10,000
    # schedules) to a few seconds after it (statistics reach pg_stat_database within 1 s).
    _sleep_until(boundary - BURST_STORE_SPAN)
    store0 = pg_transactions(cfg.svc) if case.contender.startswith("voltro") else None
    _sleep_until(boundary - 0.5)
    cpu0 = procs.cpu_total()
    _sleep_until(boundary + BURST_STORE_SPAN)
    store1 = None if store0 is None else pg_transactions(cfg.svc)
    obs.wait(cfg.burst_window + 60)
    cpu1 = procs.cpu_total()
    observer.finish(obs, out)
    result = burst_figures(observer.load(out), boundary, case.size, cfg.burst_window)
    if store0 is not None and store1 is not None:
        result["burst_db_xacts"] = store1[0] - store0[0] - 1
        result["burst_db_rows"] = store1[1] - store0[1]
        result["burst_db_ms"] = round(store1[2] - store0[2])
    result["earlier_messages"] += earlier
    result["boundaries_during_boot"] = crossed
    result["cpu_per_1k"] = _cpu_per_1k(cpu1 - cpu0, result["messages"])
    return result


#: Seconds either side of a burst's boundary over which the store's work is counted.
BURST_STORE_SPAN = 5.0


def _drop_queue(svc: Services) -> int:
    """Delete what is queued before the observer starts; return how many messages it was."""
    client = redis.Redis.from_url(svc.broker_url)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.llen(svc.queue)
        pipe.delete(svc.queue)
        count, _ = pipe.execute()
    finally:
        client.close()
    return int(count)


def burst_figures(msgs: list[Message], boundary: float, size: int, window: float) -> dict[str, Any]:
    """Figures of one burst from the observer's arrivals (times relative to the boundary).

    A message of an earlier boundary is not this burst's: one that carries an occurrence key
    (voltro_beat) is known by its instant, wherever it arrived; one without (the incumbents)
    by arriving more than a second before the boundary. Of this burst's messages, those that
    arrived before its boundary are ``early``.
    """
    earlier: list[Message] = []
    late: list[Message] = []
    for m in msgs:
        if _earlier(m, boundary):
            earlier.append(m)
        elif m.t <= boundary + window:
            late.append(m)
    early = [m for m in late if m.t < boundary]
    first_seen: dict[int | None, float] = {}
    for m in late:
        first_seen.setdefault(m.index, m.t)
    done = len(first_seen) >= size
    return {
        "messages": len(late),
        "earlier_messages": len(earlier),
        "early_messages": len(early),
        "first_s": round(min(m.t for m in late) - boundary, 3) if late else None,
        "last_s": round(max(m.t for m in late) - boundary, 3) if late else None,
        "all_s": round(max(first_seen.values()) - boundary, 3) if done else None,
        "arrived": len(first_seen),
        "arrived_pct": round(100 * len(first_seen) / size, 2),
        "duplicates": len(late) - len(first_seen),
        "same_task_id": len(late) - len({m.task_id for m in late}),
        "publishers": len({m.origin for m in late}),
    }


def _earlier(m: Message, boundary: float) -> bool:
    """Whether ``m`` is a message of a boundary before ``boundary``."""
    if m.occurrence is not None and "@" in m.occurrence:
        instant = datetime.fromisoformat(m.occurrence.rsplit("@", 1)[1]).replace(tzinfo=UTC)
        return instant.timestamp() < boundary - 0.5
    return m.t < boundary - 1


def _steady(
    case: Case, cfg: Settings, procs: Processes, env: dict[str, str], work: Path
) -> dict[str, Any]:
    out = work / "arrivals.json"
    hard_stop = time.time() + cfg.boot_timeout + cfg.steady_warmup + cfg.steady_seconds + 30
    obs = observer.start(procs, cfg.svc.broker_url, cfg.svc.queue, hard_stop, out)
    _spawn_beats(case, cfg, procs, env)
    t0 = math.ceil(_wait_ready(case, cfg, procs) + cfg.steady_warmup)
    _sleep_until(t0)
    cpu0 = procs.cpu_total()
    _sleep_until(t0 + cfg.steady_seconds)
    cpu1 = procs.cpu_total()
    _sleep_until(t0 + cfg.steady_seconds + cfg.steady_tail)
    observer.finish(obs, out)
    result = steady_figures(observer.load(out), t0, case.size, cfg.steady_seconds)
    result["cpu_per_1k"] = _cpu_per_1k(cpu1 - cpu0, result["messages"])
    return result


def steady_figures(msgs: list[Message], t0: float, size: int, seconds: int) -> dict[str, Any]:
    """Figures of a steady window [t0, t0 + seconds) of one-second schedules.

    A message's intended instant is its voltro occurrence key when it carries one (exact);
    otherwise the floor of its arrival second (an approximation: Celery's and RedBeat's
    intervals are not anchored to whole seconds, so their lag is only known within 1 s).
    """
    window: list[tuple[float, Message]] = []  # (intended instant, message)
    exact = 0
    for m in msgs:
        intended = _occurrence_instant(m.occurrence) if m.occurrence else float(math.floor(m.t))
        exact += m.occurrence is not None
        if t0 <= intended < t0 + seconds:
            window.append((intended, m))
    per_schedule = Counter(m.index for _, m in window)
    expected = size * seconds
    achieved = sum(min(per_schedule.get(i, 0), seconds) for i in range(size))
    lags = [(m.t - intended) * 1000 for intended, m in window]
    # Period actually achieved per schedule: exact for every contender, unlike the lag.
    arrivals: dict[int | None, list[float]] = {}
    for _, m in window:
        arrivals.setdefault(m.index, []).append(m.t)
    gaps = [(b - a) * 1000 for ts in arrivals.values() for a, b in itertools.pairwise(sorted(ts))]
    return {
        "messages": len(window),
        "expected": expected,
        "achieved": achieved,
        "achieved_ratio": round(achieved / expected, 4),
        "firings_per_s": round(achieved / seconds, 1),
        "duplicates": sum(max(0, n - seconds) for n in per_schedule.values()),
        "same_key": len(window) - len({m.occurrence or m.task_id for _, m in window}),
        "misses": expected - achieved,
        "publishers": len({m.origin for _, m in window}),
        "lag_basis": "occurrence key" if exact else "floor(arrival second)",
        "lag_p50_ms": _round(_pct(lags, 0.5)),
        "lag_p99_ms": _round(_pct(lags, 0.99)),
        "lag_max_ms": _round(max(lags, default=None)),
        "gap_p50_ms": _round(_pct(gaps, 0.5)),
        "gap_p99_ms": _round(_pct(gaps, 0.99)),
    }


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def _idle(
    case: Case, cfg: Settings, procs: Processes, env: dict[str, str], work: Path
) -> dict[str, Any]:
    _spawn_beats(case, cfg, procs, env)
    _wait_ready(case, cfg, procs)
    # A voltro_beat replica is built at boot and ready after its first tick; what it does
    # between ticks while nothing is due (heartbeats, the schedules table's poll, upkeep)
    # is measured once the message templates are built (a few seconds at 100,000).
    time.sleep(cfg.idle_settle)
    cpu0, t0 = procs.cpu_total(), time.monotonic()
    time.sleep(cfg.idle_window)
    cpu1, t1 = procs.cpu_total(), time.monotonic()
    return {
        "alive": all(b.popen.poll() is None for b in procs.beats),
        "idle_cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0) / len(procs.beats), 2),
    }
