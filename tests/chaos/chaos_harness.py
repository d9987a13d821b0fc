"""What the chaos scenarios add to the acceptance harness (``tests/acceptance/vbt_harness.py``).

* :class:`ChaosDeployment`: a replica can run under its own environment (libfaketime) and its
  own settings (a broker URL through a :mod:`tcp_proxy` proxy), written as a config file that
  loads the deployment's and overrides it.
* :class:`PrivateRabbit`: a RabbitMQ node of the test's own (own node name, ports, data and log
  dirs, no plugins), started with ``rabbitmq-server`` and stopped with ``rabbitmqctl -n``.
* :class:`MissedWatcher`: polls the run table and notes when (on the true clock) each row was
  first seen ``missed``, to tell a row recorded before ``instant + max_lateness``.
* :func:`tally`: the summary row of a scenario (occurrences, executed once, executed twice,
  second messages, early, missed by reason, lost), from the worker's executions and the run
  rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tcp_proxy import Proxy, ProxyHub
from vbt_harness import (
    REPLICAS,
    Deployment,
    Deployments,
    Outcome,
    Proc,
    ProcessSet,
    Sched,
    free_port,
    now,
    require_binary,
    scheduled_at,
    wait_until,
)

from voltro_beat.occurrences import occurrence_key, task_id_for

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: Debian's libfaketime (package ``faketime``). ``FAKETIME_DONT_FAKE_MONOTONIC=1`` is not
#: usable: Python >= 3.11 sleeps with ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``,
#: which libfaketime 0.9.10 then breaks (EINVAL; wolfcw/libfaketime#426). So the monotonic
#: clock is shifted too, which changes no duration.
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
#: Short takeover times so that the scenarios are short; the publish timeout must exceed twice
#: the broker connection timeout.
FAST_TAKEOVER = {"voltro_beat_publish_timeout": 4, "broker_connection_timeout": 1}
PUBLISH_TIMEOUT = timedelta(seconds=4)
#: An execution counts as early when it started more than this before its instant (what two
#: clock readings on one host can disagree by).
EARLY_SLACK = timedelta(milliseconds=5)


def require_file(path: Path, package: str) -> None:
    """Fail under ``CI=true``, skip loudly otherwise, if ``path`` (of ``package``) is missing."""
    if not path.exists():
        message = f"CHAOS TEST NEEDS {path} (Debian package {package})"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(f"!!! {message} -- SKIPPING; install it or set CI=true to fail")


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that shifts a process's clocks by ``offset`` (``"+5s"``, ``"-5s"``)."""
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": offset}


def measured_offset(env: Mapping[str, str]) -> float:
    """The wall-clock offset a process started with ``env`` sees, in seconds."""
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return float(out) - (before + time.time()) / 2


# -- deployment -----------------------------------------------------------------------------


@dataclass
class ChaosDeployment(Deployment):
    """A :class:`Deployment` whose replicas can differ: ``wrap[name]`` is extra environment
    (libfaketime), ``overrides[name]`` extra settings (a proxied broker URL)."""

    wrap: dict[str, dict[str, str]] = field(default_factory=dict)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def replica_config(self, name: str) -> Path:
        if name not in self.overrides:
            return self.config_file
        path = self.workdir / f"vbt_config_{name}.py"
        path.write_text(
            "import runpy\n"
            f"CONFIG = dict(runpy.run_path({str(self.config_file)!r})['CONFIG'])\n"
            f"CONFIG.update({self.overrides[name]!r})\n"
        )
        return path

    def through_proxies(
        self, hub: ProxyHub, target: tuple[str, int], url: Callable[[Proxy], str] = Proxy.url
    ) -> None:
        """Every replica reaches the broker at ``target`` through a proxy of its own of
        ``hub`` (named after it), the broker URL ``url(proxy)``; the worker connects directly."""
        for name in REPLICAS:
            self.overrides[name] = {"broker_url": url(hub.add(name, target))}

    def start_beats(self, *names: str) -> None:
        for name in names:
            env = self.env(
                VOLTRO_BEAT_REPLICA=name,
                VBT_CONFIG_FILE=str(self.replica_config(name)),
                **self.wrap.get(name, {}),
            )
            self.beats[name] = self.procs.start(
                name, self.beat_argv(name), env=env, cwd=self.workdir, log=self._log(name)
            )

    def restart_beat(self, name: str, *, timeout: float = 60) -> None:
        """SIGTERM one replica (a clean stop), start it again, wait until it announced itself."""
        self.beats[name].stop()
        self.start_beats(name)
        proc = self.beats[name]
        if not wait_until(lambda: "voltro_beat: replica " in proc.text(), timeout=timeout):
            raise AssertionError(f"{name} did not restart:\n{proc.tail()}")

    @property
    def libpq_store(self) -> str:
        return self.store_url.replace("postgresql+psycopg://", "postgresql://", 1)

    def claimed_keys(self, instant: datetime) -> dict[str, set[str]]:
        """The keys of ``instant`` each replica claimed (the claims table: it keeps them
        whatever became of the runs)."""
        return self._keys_by_replica(
            "SELECT replica, id FROM _voltro_schedule_claims WHERE scheduled_at = %s", instant
        )

    def held_keys(self, instant: datetime) -> dict[str, set[str]]:
        """The keys of ``instant`` each replica holds still ``claimed`` (not yet sent)."""
        return self._keys_by_replica(
            "SELECT replica, id FROM _voltro_schedule_runs"
            " WHERE scheduled_at = %s AND status = 'claimed' AND published_at IS NULL",
            instant,
        )

    def _keys_by_replica(self, query: str, instant: datetime) -> dict[str, set[str]]:
        with psycopg.connect(self.libpq_store, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(query, (instant,)).fetchall()
        keys: dict[str, set[str]] = {}
        for replica, key in rows:
            keys.setdefault(replica, set()).add(key)
        return keys

    def wait_for_claims(self, instant: datetime, *, until: datetime) -> dict[str, set[str]]:
        """Poll until ``instant``'s claims ahead show up (or ``until``), let the other
        replicas' claim statements finish, and return the claimed keys by replica."""
        while True:
            with contextlib.suppress(psycopg.Error):
                if self.held_keys(instant):
                    break
            if now() >= until:
                return {}
            time.sleep(0.02)
        time.sleep(max(0.0, min(0.15, (until - now()).total_seconds())))
        return self.held_keys(instant)


def holder(held: Mapping[str, set[str]]) -> str:
    """The replica holding the most keys."""
    assert held, "no claim ahead of the burst was seen before its instant"
    return max(held, key=lambda name: len(held[name]))


class ChaosDeployments(Deployments):
    deployment_class = ChaosDeployment

    def __call__(self, store: str = "postgresql", broker: str = "redis", **options: Any) -> Any:
        dep = super().__call__(store, broker, **options)
        assert isinstance(dep, ChaosDeployment)
        return dep


def boot(
    dep: ChaosDeployment,
    schedules: Sequence[Sched],
    replicas: Sequence[str],
    **settings: Any,
) -> None:
    """Configure, start the worker and the replicas, wait until all are ready."""
    dep.configure(schedules, **{**FAST_TAKEOVER, **settings})
    dep.start_worker()
    dep.start_beats(*replicas)
    dep.wait_ready(timeout=90)


def burst(count: int, every: str = "timedelta(seconds=15)", prefix: str = "burst") -> list[Sched]:
    """``count`` schedules due at the same instants (every 15 s, epoch-anchored)."""
    return [Sched(f"{prefix}-{i:04d}", every) for i in range(count)]


def keys_at(schedules: Iterable[Sched], instant: datetime) -> list[str]:
    return [occurrence_key(s.name, instant) for s in schedules]


# -- private RabbitMQ ---------------------------------------------------------------------------


class PrivateRabbit:
    """A RabbitMQ node of the test's own: node ``vbt-<hex>@localhost``, free AMQP and
    distribution ports, its data, logs, config and Erlang cookie (``HOME``) in ``root``, no
    plugins (the machine's node may hold the management port), the machine's
    ``rabbitmq-env.conf`` not read. Started as the current user with the scripts under
    ``/usr/lib/rabbitmq/bin`` (``/usr/sbin/rabbitmq-server`` would ``su`` to ``rabbitmq``).
    """

    def __init__(self, root: Path, procs: ProcessSet) -> None:
        self.root = root
        self.procs = procs
        self.node = f"vbt-{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.proc: Proc | None = None
        self._starts = 0
        (root / "env.conf").write_text("")
        (root / "enabled_plugins").write_text("[].\n")
        (root / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")

    def env(self) -> dict[str, str]:
        root = str(self.root)
        return {
            **os.environ,
            "HOME": root,
            "RABBITMQ_CONF_ENV_FILE": f"{root}/env.conf",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": f"{root}/mnesia",
            "RABBITMQ_LOG_BASE": f"{root}/log",
            "RABBITMQ_CONFIG_FILE": f"{root}/rabbitmq",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{root}/enabled_plugins",
            "RABBITMQ_PID_FILE": f"{root}/rabbit.pid",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self, timeout: float = 90) -> None:
        self._starts += 1
        self.proc = self.procs.start(
            "rabbitmq",
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            env=self.env(),
            cwd=self.root,
            log=self.root / f"rabbitmq.{self._starts}.log",
        )
        if not wait_until(self._answers, timeout=timeout, interval=0.2):
            raise RuntimeError(f"private RabbitMQ did not start:\n{self.proc.tail()}")

    def stop(self) -> None:
        """A clean node stop (``rabbitmqctl -n <node> stop``); SIGKILL if it lingers."""
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(
                [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, "stop"],
                env=self.env(),
                capture_output=True,
                timeout=60,
            )
        if self.proc is not None:
            self.proc.stop(timeout=20)

    def _answers(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                return bool(sock.recv(8))
        except OSError:
            return False


def start_private_rabbit(made: Deployments) -> PrivateRabbit:
    require_binary(str(RABBITMQ_BIN / "rabbitmq-server"), str(RABBITMQ_BIN / "rabbitmqctl"))
    root = made.workdir / "rabbitmq"
    root.mkdir()
    rabbit = PrivateRabbit(root, made.procs)
    rabbit.start()
    return rabbit


# -- observation --------------------------------------------------------------------------------


class MissedWatcher:
    """Notes, on the true clock, when each run row was first seen ``missed`` (polled every
    ``interval``): a row seen missed before its instant plus ``max_lateness`` was recorded
    too early, whatever the clock of the replica that wrote it."""

    def __init__(self, libpq_url: str, interval: float = 0.2) -> None:
        self.url = libpq_url
        self.interval = interval
        self.first_seen: dict[str, tuple[datetime, str | None, str | None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MissedWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                rows = conn.execute(
                    "SELECT id, reason, replica FROM _voltro_schedule_runs WHERE status = 'missed'"
                ).fetchall()
                seen = now()
                for key, reason, replica in rows:
                    self.first_seen.setdefault(key, (seen, reason, replica))
            except psycopg.Error:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            self._stop.wait(self.interval)
        if conn is not None:
            conn.close()


@dataclass
class Tally:
    """One scenario's row of the summary table."""

    scenario: str
    occurrences: int = 0
    executed_once: int = 0
    #: Executions of an occurrence beyond its first, whatever message they came from: the
    #: body run twice, which must never happen.
    executed_twice: int = 0
    #: Deliveries of an occurrence beyond its first, executed or not (the worker's duplicate
    #: guard skips them: the run row's ``duplicates``): second messages, and how many
    #: occurrences had any.
    second_messages: int = 0
    second_keys: int = 0
    #: Executions of a message the broker delivered again (flagged ``redelivered``: an
    #: unacknowledged delivery when the broker or the connection went away).
    redelivered: int = 0
    #: Executions that started before their instant (more than EARLY_SLACK).
    early: int = 0
    #: Run rows ``missed``, by reason; and how many were seen missed before instant +
    #: max_lateness.
    missed: dict[str, int] = field(default_factory=dict)
    missed_early: int = 0
    #: Neither executed nor recorded missed.
    lost: int = 0
    #: Of those, how many the broker had accepted (found in a private Redis's append-only
    #: file): lost between the broker and the worker rather than by the scheduler. Still
    #: lost, still a problem; the evidence says where to look.
    lost_after_broker: int = 0
    result: str = ""
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def tally(
    scenario: str,
    outcome: Outcome,
    *,
    max_lateness: Mapping[str, timedelta] | None = None,
    missed_seen: Mapping[str, tuple[datetime, str | None, str | None]] | None = None,
    accepted: Callable[[Sequence[str]], set[str]] | None = None,
) -> Tally:
    """Count what happened to ``outcome.keys`` and list each problem (duplicate, early
    execution, missed before its bound, lost, wrong task id)."""
    keys = set(outcome.keys)
    ran: dict[str, list[datetime]] = {}
    again: Counter[str] = Counter()
    problems: list[str] = []
    for e in outcome.executions:
        key = e.occurrence or f"<no header {e.task_id}>"
        ran.setdefault(key, []).append(e.executed_at)
        again[key] += bool(e.redelivered)
        if e.occurrence is not None and e.task_id != task_id_for(e.occurrence):
            problems.append(f"{key}: executed with task id {e.task_id}, not uuid5(key)")
    t = Tally(scenario, occurrences=len(keys))
    lost: list[str] = []
    second = second_messages(outcome)
    for key in sorted(keys):
        times = ran.get(key, [])
        run = outcome.runs.get(key)
        instant = scheduled_at(key)
        t.redelivered += again[key]
        if len(times) == 1:
            t.executed_once += 1
        if second[key]:
            t.second_messages += second[key]
            t.second_keys += 1
        if len(times) > 1:
            t.executed_twice += len(times) - 1
            problems.append(f"{key}: executed {len(times)} times ({again[key]} redelivered)")
        early = [at for at in times if at < instant - EARLY_SLACK]
        if early:
            t.early += len(early)
            lead = (instant - min(early)).total_seconds()
            problems.append(f"{key}: executed {lead:.3f}s before its instant")
        if run is not None and run.status == "missed":
            reason = run.reason or "?"
            t.missed[reason] = t.missed.get(reason, 0) + 1
            seen = (missed_seen or {}).get(key)
            bound = (max_lateness or {}).get(run.schedule)
            if seen is not None and bound is not None and seen[0] < instant + bound:
                t.missed_early += 1
                if seen[0] < instant:
                    when = f"{(instant - seen[0]).total_seconds():.2f}s before its instant"
                else:
                    ahead = (instant + bound - seen[0]).total_seconds()
                    when = f"{ahead:.2f}s before instant + max_lateness ({bound})"
                problems.append(f"{key}: recorded missed ({reason}, by {run.replica}) {when}")
            if times:
                problems.append(f"{key}: recorded missed ({reason}) but executed")
        elif not times:
            t.lost += 1
            lost.append(key)
    downstream = accepted([task_id_for(k) for k in lost]) if accepted and lost else set()
    for key in lost:
        run = outcome.runs.get(key)
        shown = run and (run.status, run.reason, run.replica)
        if task_id_for(key) in downstream:
            t.lost_after_broker += 1
            where = "; its message was accepted by Redis (in the append-only file)"
        else:
            where = ""
        problems.append(f"{key}: never executed, not recorded missed (run row {shown}){where}")
    # Executions of occurrences outside the window are not counted, but one run twice is
    # still run twice.
    for key, times in ran.items():
        if key not in keys and len(times) > 1:
            problems.append(f"{key} (outside the window): executed {len(times)} times")
    t.problems = problems
    return t


def second_messages(outcome: Outcome) -> Counter[str]:
    """Deliveries of each occurrence beyond its first that the broker did not flag as
    redelivered: the ones the worker's guard skipped (its run row's ``duplicates``) and any
    it executed."""
    executed = Counter(e.occurrence for e in outcome.executions if not e.redelivered)
    counts: Counter[str] = Counter()
    for key, run in outcome.runs.items():
        counts[key] += run.duplicates or 0
    for key, n in executed.items():
        if key is not None and n > 1:
            counts[key] += n - 1
    return counts


def executions_by_replica(outcome: Outcome, keys: Iterable[str]) -> Counter[str]:
    """Which replica's run row each of ``keys`` ended with (after any takeover)."""
    return Counter(
        (outcome.runs[k].replica or "?") if k in outcome.runs else "no row" for k in keys
    )


def redis_accepted(redis_dir: Path) -> Callable[[Sequence[str]], set[str]]:
    """Which of some task ids a private Redis (``PrivateRedis``, AOF in ``redis_dir``) was
    ever given in a write: a message it accepted, whatever happened to it later."""

    def accepted(task_ids: Sequence[str]) -> set[str]:
        blobs = [f.read_bytes() for f in sorted(redis_dir.glob("appendonly*/*.aof"))]
        blobs += [f.read_bytes() for f in sorted(redis_dir.glob("appendonly*.aof"))]
        return {t for t in task_ids if any(t.encode() in blob for blob in blobs)}

    return accepted


def redis_backlog(url: str, queue: str) -> str:
    """What a private Redis still holds for the worker: the queue's length and the
    delivered-but-unacknowledged messages (evidence for a note)."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=5)
        return f"queue {client.llen(queue)}, unacked {client.hlen('unacked')}"
    except redis.RedisError as exc:
        return f"unreadable ({exc})"


def republished(dep: Deployment) -> dict[str, int]:
    """Per replica: runs its recovery sweeps tried to republish (a failed attempt is counted
    again at the next try), from its log (evidence only)."""
    counts = {}
    for name, proc in dep.beats.items():
        found = re.findall(r"republishing (\d+) unconfirmed runs", proc.text())
        counts[name] = sum(int(n) for n in found)
    return counts


# -- results ------------------------------------------------------------------------------------


class Results:
    """The summary rows of a session, merged into ``results/summary.json`` at its end (rows of
    scenarios not run this time are kept, so that a partial run refreshes only its own)."""

    def __init__(self) -> None:
        self.rows: list[Tally] = []

    def add(self, row: Tally, *, asserted: bool = True) -> Tally:
        if asserted:
            row.result = "FAIL" if row.problems else "pass"
        else:
            row.result = "reported"
        self.rows.append(row)
        return row

    def write(self) -> Path | None:
        if not self.rows:
            return None
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / "summary.json"
        previous: dict[str, Any] = {}
        if path.exists():
            with contextlib.suppress(ValueError):
                previous = json.loads(path.read_text())
        rows = {row["scenario"]: row for row in previous.get("rows", [])}
        for row in self.rows:
            data = row.as_json()
            data["problems"] = data["problems"][:20] + (
                [f"... and {len(row.problems) - 20} more"] if len(row.problems) > 20 else []
            )
            data["problem_count"] = len(row.problems)
            data["run_at"] = now().strftime("%Y-%m-%d %H:%M UTC")
            data["commit"] = _commit()
            rows[row.scenario] = data
        ordered = sorted(rows.values(), key=lambda r: r["scenario"])
        path.write_text(json.dumps({"rows": ordered}, indent=2) + "\n")
        return path


def _commit() -> str:
    git = shutil.which("git")
    if git is None:
        return "?"
    out = subprocess.run(
        [git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    )
    return out.stdout.strip() or "?"


@contextlib.contextmanager
def watching_missed(dep: ChaosDeployment) -> Iterator[MissedWatcher]:
    with MissedWatcher(dep.libpq_store) as watcher:
        yield watcher


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
