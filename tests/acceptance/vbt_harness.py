"""Real processes for the acceptance tests: beat replicas, a worker, private services.

Everything here drives subprocesses (``celery beat -S voltro``, ``celery worker``,
``redis-server``, ``pg_ctl``) and reads the results back by SQL. Each process runs in its own
process group so that a finaliser can kill it and its children, and so that ``kill -9`` of a
replica is exactly that.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from kombu import Connection

from voltro_beat.occurrences import occurrence_key, occurrences_between, task_id_for
from voltro_beat.schedules import Entry, parse_entries, to_spec
from voltro_beat.store.tables import runs as runs_table

HERE = Path(__file__).resolve().parent
TASK = "vbt_proj.record"
#: Statuses a run row may hold once its message went to the broker ("published or later").
PUBLISHED_OR_LATER = frozenset({"published", "started", "retrying", "succeeded"})
#: Names available to the schedule source strings, in the tests and in the config file.
SOURCE_IMPORTS = (
    "from datetime import datetime, timedelta, timezone\n"
    "from celery.schedules import crontab, schedule\n"
)
ROOT = HERE.parent.parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The shared servers, movable with the variables tests/conftest.py reads.
POSTGRES_ADMIN_URL = os.environ.get(
    "VOLTRO_TEST_POSTGRES", "postgresql+psycopg://root@127.0.0.1:5432/postgres"
)
#: libpq form of the PostgreSQL server, without a database.
SHARED_PG = sa.make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql", database=None)
REDIS_URL = os.environ.get("VOLTRO_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/") + "/12"
AMQP_URL = os.environ.get("VOLTRO_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
EXECUTIONS_DDL = """
CREATE TABLE vbt_executions (
    seq bigserial PRIMARY KEY,
    task_id text NOT NULL,
    occurrence text,
    periodic_task_name text,
    worker_pid integer NOT NULL,
    executed_at timestamptz NOT NULL,
    redelivered boolean
)"""


def now() -> datetime:
    return datetime.now(UTC)


def wait_until(condition: Callable[[], bool], *, timeout: float, interval: float = 0.25) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; return whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def sleep_until(instant: datetime) -> None:
    delay = (instant - now()).total_seconds()
    if delay > 0:
        time.sleep(delay)


def next_boundary(after: datetime, every: timedelta, offset: timedelta) -> datetime:
    """The first instant ``k * every + offset`` (epoch-anchored) after ``after``."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    steps = (after - epoch - offset) // every + 1
    return epoch + steps * every + offset


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- schedules -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sched:
    """One ``beat_schedule`` entry, written as Python source so that the test and the beat
    processes build it from the same text.

    ``schedule`` is the source of the schedule value (``"timedelta(seconds=2)"``);
    ``extra`` holds further entry keys (``max_lateness``, ``catch_up``, ``tz``) as source.
    """

    name: str
    schedule: str
    extra: Mapping[str, str] = field(default_factory=dict)
    task: str = TASK

    def source(self) -> str:
        items = [f'"task": {self.task!r}', f'"schedule": {self.schedule}']
        items += [f"{key!r}: {value}" for key, value in self.extra.items()]
        return "{" + ", ".join(items) + "}"

    def entry(self) -> Entry:
        """The entry as the scheduler validates it (UTC app timezone)."""
        namespace: dict[str, Any] = {}
        exec(SOURCE_IMPORTS, namespace)
        raw = eval(self.source(), namespace)
        (entry,) = parse_entries({self.name: raw}, tz="UTC", max_lateness=timedelta(days=1))
        return entry

    def keys_between(self, start: datetime, end: datetime) -> list[str]:
        """Keys of this schedule's occurrences in ``[start, end)``."""
        spec = self.entry().spec
        return [occurrence_key(self.name, at) for at in occurrences_between(spec, start, end)]


REPLICAS = ("r1", "r2", "r3")
EVERY_SECOND = Sched("every-second", '"* * * * * *"')
EVERY_2S = Sched("every-2s", "timedelta(seconds=2)")
EVERY_MINUTE = Sched("every-minute", "crontab()")


def expected_keys(schedules: Iterable[Sched], start: datetime, end: datetime) -> list[str]:
    return [key for s in schedules for key in s.keys_between(start, end)]


def scheduled_at(key: str) -> datetime:
    """The instant in an occurrence key (``name@YYYY-MM-DDTHH:MM:SS[.mmm]``)."""
    text = key.rpartition("@")[2]
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def write_config(path: Path, *, schedules: Iterable[Sched], settings: Mapping[str, Any]) -> None:
    """Write the config file :mod:`vbt_proj` loads: ``CONFIG`` = settings + beat_schedule."""
    body = [SOURCE_IMPORTS, f"CONFIG = {dict(settings)!r}", "CONFIG['beat_schedule'] = {"]
    body += [f"    {s.name!r}: {s.source()}," for s in schedules]
    body.append("}")
    path.write_text("\n".join(body) + "\n")


# -- processes ----------------------------------------------------------------------------


class Proc:
    """A subprocess in its own process group, its output in a log file."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self._done = False
        self._out = log.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def signal(self, sig: int) -> None:
        """Signal the process group, unless it was already stopped and reaped (its id might
        belong to someone else's process group by now)."""
        if self._done:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill9(self) -> None:
        """``kill -9`` the process group: no clean-up of any kind runs."""
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)
        self._finish()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (a clean stop), then SIGKILL of the whole group if it lingers."""
        if self.alive():
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        # Also ends children that outlived their leader (the group id stays theirs).
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._finish()
        return self.popen.returncode

    def _finish(self) -> None:
        if self.popen.returncode is not None:
            self._done = True
        self._out.close()


class ProcessSet:
    """Every process a test started; :meth:`close` kills them all (used in finalisers)."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path
    ) -> Proc:
        proc = Proc(name, argv, env=env, cwd=cwd, log=log)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(timeout=10)

    def tails(self) -> str:
        return "\n\n".join(f"===== {p.name} ({p.log}) =====\n{p.tail(60)}" for p in self.procs)


def run_checked(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{argv} failed ({result.returncode}): {result.stdout}{result.stderr}")
    return result


# -- databases ----------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_database(prefix: str = "vbt_acc") -> Iterator[str]:
    """Create an empty database on the shared PostgreSQL server; drop it afterwards.

    Yields the database's libpq URL.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = SHARED_PG.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield SHARED_PG.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            # FORCE: a process killed mid-test may have left a connection behind.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sqlalchemy_url(libpq_url: str) -> str:
    return libpq_url.replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass(frozen=True)
class Run:
    id: str
    schedule: str
    task_id: str
    scheduled_at: datetime
    coordination_outcome: str
    status: str
    reason: str | None
    replica: str | None
    claimed_at: datetime | None
    published_at: datetime | None
    #: Deliveries whose body the worker's duplicate guard did not run (None: none).
    duplicates: int | None = None


@dataclass(frozen=True)
class Execution:
    task_id: str
    occurrence: str | None
    periodic_task_name: str | None
    worker_pid: int
    executed_at: datetime
    #: The broker delivered this message again (``delivery_info["redelivered"]``): one
    #: message executed twice, not two messages.
    redelivered: bool | None = None


def read_runs(store_url: str) -> dict[str, Run]:
    """Every run row of the store at ``store_url``, by key (empty if there is no table)."""
    engine = sa.create_engine(store_url, poolclass=sa.NullPool)
    try:
        if not sa.inspect(engine).has_table(runs_table.name):
            return {}
        columns = [runs_table.c[name] for name in Run.__dataclass_fields__]
        with engine.connect() as conn:
            rows = conn.execute(sa.select(*columns)).all()
    finally:
        engine.dispose()
    return {row.id: Run(*row) for row in rows}


def read_executions(dsn: str) -> list[Execution]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT task_id, occurrence, periodic_task_name, worker_pid, executed_at,"
            " redelivered FROM vbt_executions ORDER BY seq"
        ).fetchall()
    return [Execution(*row) for row in rows]


# -- the system under test ----------------------------------------------------------------


@dataclass
class Deployment:
    """Beat replicas and a worker of :mod:`vbt_proj` sharing one store and one broker.

    ``exec_dsn`` is the test's own PostgreSQL database, where the worker records executions.
    """

    workdir: Path
    procs: ProcessSet
    store_url: str
    broker_url: str
    exec_dsn: str
    queue: str = field(default_factory=lambda: f"vbt-acc-{uuid.uuid4().hex[:10]}")
    #: The module ``celery -A`` loads in every process, and the worker's pool size.
    app: str = "vbt_proj"
    concurrency: int = 2
    #: The beats' ``--loglevel``.
    loglevel: str = "info"
    beats: dict[str, Proc] = field(default_factory=dict)
    worker: Proc | None = None
    _starts: Counter[str] = field(default_factory=Counter)

    def configure(self, schedules: Iterable[Sched], **settings: Any) -> None:
        """Write the config every process of this deployment reads (before starting any)."""
        base = {
            "broker_url": self.broker_url,
            "task_default_queue": self.queue,
            "broker_connection_retry_on_startup": True,
            "worker_hijack_root_logger": True,
        }
        write_config(self.config_file, schedules=schedules, settings={**base, **settings})

    @property
    def config_file(self) -> Path:
        return self.workdir / "vbt_config.py"

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VOLTRO_", "CELERY_", "VBT_", "PYTHONPATH"))
        }
        env.update(
            PYTHONPATH=os.pathsep.join((str(HERE), str(ROOT))),
            PYTHONUNBUFFERED="1",
            VBT_CONFIG_FILE=str(self.config_file),
            VBT_EXEC_DSN=self.exec_dsn,
            VOLTRO_BEAT_STORE_URL=self.store_url,
        )
        env.update(extra)
        return env

    def _log(self, name: str) -> Path:
        self._starts[name] += 1
        return self.workdir / f"{name}.{self._starts[name]}.log"

    def beat_argv(self, name: str) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", self.app, "beat", "-S", "voltro",
            "-l", self.loglevel, "-s", str(self.workdir / f"celerybeat-{name}"),
        ]  # fmt: skip

    def start_beats(self, *names: str, **env: str) -> None:
        """Start replicas ``names``, with ``env`` as further environment variables."""
        for name in names:
            self.beats[name] = self.procs.start(
                name,
                self.beat_argv(name),
                env=self.env(VOLTRO_BEAT_REPLICA=name, **env),
                cwd=self.workdir,
                log=self._log(name),
            )

    def start_worker(self) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", self.app, "worker", "-P", "prefork",
            "-c", str(self.concurrency), "-l", "info", "--without-mingle", "--without-gossip",
            "--without-heartbeat", "-Q", self.queue, "-n", f"{self.queue}@%h",
        ]  # fmt: skip
        self.worker = self.procs.start(
            "worker", argv, env=self.env(), cwd=self.workdir, log=self._log("worker")
        )

    def create_executions_table(self) -> None:
        with psycopg.connect(self.exec_dsn, autocommit=True) as conn:
            conn.execute(EXECUTIONS_DDL)

    def wait_ready(self, *, timeout: float = 60) -> None:
        """Wait until the worker is consuming and every running replica has set up and ticked.

        A replica's first tick upgrades the schema and reads the catch-up state; it follows its
        "voltro_beat: replica ..." announcement immediately, so one more second covers it.
        """
        procs = [p for p in self.beats.values() if p.alive()]
        if self.worker is not None:
            procs.append(self.worker)

        def ready(p: Proc) -> bool:
            marker = " ready." if p is self.worker else "voltro_beat: replica "
            if not p.alive():
                raise AssertionError(f"{p.name} exited early:\n{p.tail()}")
            return marker in p.text()

        if not wait_until(lambda: all(ready(p) for p in procs), timeout=timeout):
            raise AssertionError(f"processes not ready in {timeout}s:\n{self.procs.tails()}")
        time.sleep(1.0)

    def stop_beats(self, *names: str) -> None:
        for name in names or list(self.beats):
            self.beats[name].stop()

    def runs(self) -> dict[str, Run]:
        return read_runs(self.store_url)

    def executions(self) -> list[Execution]:
        return read_executions(self.exec_dsn)

    def queue_length(self) -> int:
        with Connection(self.broker_url, connect_timeout=5) as conn:
            return _queue_length(conn, self.queue)

    def delete_queue(self) -> None:
        with (
            contextlib.suppress(Exception),
            Connection(self.broker_url, connect_timeout=5) as conn,
        ):
            conn.default_channel.queue_delete(self.queue)

    def drain(self, keys: Iterable[str], *, timeout: float = 45) -> None:
        """After the beats stopped: wait until each of ``keys`` executed or was recorded
        ``missed``, and the worker went quiet.

        Returns without raising when the deadline passes: the assertions that follow say
        precisely what is missing.
        """
        wanted = set(keys)

        def settled() -> bool:
            missed = {k for k, r in self.runs().items() if r.status == "missed"}
            return wanted <= missed | {e.occurrence for e in self.executions()}

        wait_until(settled, timeout=timeout, interval=0.5)
        # Let anything still in flight (a duplicate, say) arrive before the assertions.
        last = -1
        for _ in range(int(timeout)):
            count = len(self.executions())
            if count == last and self._queue_empty():
                return
            last = count
            time.sleep(1.5)

    def _queue_empty(self) -> bool:
        try:
            return self.queue_length() == 0
        except Exception:
            return False


def _queue_length(conn: Connection, queue: str) -> int:
    try:
        declared = conn.default_channel.queue_declare(queue, passive=True)
    except Exception:
        return 0  # no such queue: nothing was ever published to it
    count: int = declared.message_count
    return count


class Deployments:
    """Builds the :class:`Deployment` of a test: ``deployments(store=..., broker=...)``.

    ``store``: ``"postgresql"`` (the test's own database), ``"sqlite"`` (a file in the work
    dir) or a store URL; ``broker``: ``"redis"``, ``"rabbitmq"`` or a broker URL.
    """

    #: What :meth:`__call__` builds (the chaos suite's subclass adds per-replica wrappers).
    deployment_class: type[Deployment] = Deployment

    def __init__(
        self,
        workdir: Path,
        procs: ProcessSet,
        exec_db: str,
        need: Callable[[str], None] = lambda service: None,
    ) -> None:
        self.workdir = workdir
        self.procs = procs
        self.exec_db = exec_db
        #: Called with "redis" or "rabbitmq" before a deployment uses that shared broker.
        self.need = need
        self.made: list[Deployment] = []

    def __call__(
        self, store: str = "postgresql", broker: str = "redis", **options: Any
    ) -> Deployment:
        """``options``: further :class:`Deployment` fields (``app``, ``concurrency``)."""
        if broker in ("redis", "rabbitmq"):
            self.need(broker)
        stores = {
            "postgresql": sqlalchemy_url(self.exec_db),
            "sqlite": f"sqlite:///{self.workdir / 'voltro.sqlite3'}",
        }
        dep = self.deployment_class(
            workdir=self.workdir,
            procs=self.procs,
            store_url=stores.get(store, store),
            broker_url={"redis": REDIS_URL, "rabbitmq": AMQP_URL}.get(broker, broker),
            exec_dsn=self.exec_db,
            **options,
        )
        dep.create_executions_table()
        self.made.append(dep)
        return dep

    def close(self) -> None:
        """Stop every process, then delete the queues the deployments used."""
        self.procs.close()
        for dep in self.made:
            dep.delete_queue()


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the requesting test failed in its setup or call (``tests/conftest.py`` keeps
    each phase's report on the item)."""
    return any(
        getattr(getattr(request.node, f"vbt_rep_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory, removed afterwards unless ``VBT_KEEP=1`` (then its path is
    printed)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if os.environ.get("VBT_KEEP") == "1":
            print(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def deployments(
    need: Callable[..., None],
    show_logs: Callable[[], bool],
    *,
    prefix: str = "vbt-acc-",
    factory: type[Deployments] = Deployments,
) -> Iterator[Deployments]:
    """A work dir, a process set and a fresh database on the shared server; all removed after.

    The process logs are printed at the end when ``show_logs()`` says so (a test failed).
    """
    need("postgresql")
    with temp_dir(prefix) as workdir, fresh_database() as exec_db:
        made = factory(workdir, ProcessSet(), exec_db, need=need)
        try:
            yield made
        finally:
            made.close()
            if show_logs():
                print(made.procs.tails())


# -- checks -------------------------------------------------------------------------------


def problems_exactly_once(
    keys: Iterable[str],
    runs: Mapping[str, Run],
    executions: Sequence[Execution],
    *,
    outcome: str = "won_lock",
) -> list[str]:
    """What breaks "each of ``keys`` ran exactly once, recorded as published by the gate"."""
    by_key: dict[str, list[Execution]] = {}
    for e in executions:
        by_key.setdefault(e.occurrence or f"<no header: {e.task_id}>", []).append(e)
    problems: list[str] = []
    for key in keys:
        ran = by_key.get(key, [])
        run = runs.get(key)
        if len(ran) != 1:
            problems.append(f"{key}: executed {len(ran)} times")
        if run is None:
            problems.append(f"{key}: no run row")
            continue
        if run.coordination_outcome != outcome:
            problems.append(f"{key}: outcome {run.coordination_outcome!r}, not {outcome!r}")
        if run.status not in PUBLISHED_OR_LATER:
            problems.append(f"{key}: status {run.status!r} ({run.reason})")
        if run.task_id != task_id_for(key) or any(e.task_id != run.task_id for e in ran):
            problems.append(f"{key}: task ids {[e.task_id for e in ran]} vs run {run.task_id}")
    return problems


@dataclass(frozen=True)
class TableChange:
    """One change of a schedule of the schedules table: its revision, its commit, and its
    cron string after it (None: disabled or removed)."""

    revision: int
    changed_at: datetime
    cron: str | None


def read_changes(store_url: str) -> dict[str, list[TableChange]]:
    """Every change of the schedules table, by schedule, oldest first."""
    engine = sa.create_engine(store_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT name, revision, changed_at, after FROM _voltro_beat_schedule_changes"
                    " ORDER BY revision"
                )
            ).all()
    finally:
        engine.dispose()
    found: dict[str, list[TableChange]] = {}
    for name, revision, changed_at, after in rows:
        row = json.loads(after) if after else None
        cron = row["definition"]["schedule"] if row and row["enabled"] else None
        found.setdefault(name, []).append(TableChange(revision, changed_at, cron))
    return found


def _live_at(changes: Sequence[TableChange], at: datetime) -> TableChange | None:
    before = [c for c in changes if c.changed_at < at]
    return before[-1] if before else None


def table_keys(name: str, changes: Sequence[TableChange], until: datetime) -> list[str]:
    """The occurrences a schedule of the table owes: each definition's instants from one
    second after its commit (every replica applied it by then) to the next change."""
    keys = []
    for change, following in zip(changes, [*changes[1:], None], strict=True):
        if change.cron is None:
            continue
        end = until if following is None else following.changed_at
        spec = to_spec(change.cron)
        start = change.changed_at + timedelta(seconds=1)
        keys += [occurrence_key(name, at) for at in occurrences_between(spec, start, end)]
    return keys


def problems_revisions(
    name: str,
    changes: Sequence[TableChange],
    runs: Mapping[str, Run],
    revisions: Mapping[str, int | None],
) -> list[str]:
    """What breaks "each run of ``name`` was fired by the definition live at its instant, or
    by the one live when it was claimed (claimed ahead of a change), and is an instant of
    that definition"."""
    problems = []
    by_revision = {c.revision: c for c in changes}
    for key, run in runs.items():
        if run.schedule != name:
            continue
        at = scheduled_at(key)
        allowed = {
            c.revision
            for c in (_live_at(changes, at), _live_at(changes, run.claimed_at or at))
            if c is not None
        }
        fired = by_revision.get(revisions.get(key) or 0)
        if fired is None or fired.revision not in allowed:
            problems.append(f"{key}: revision {revisions.get(key)}, live then: {sorted(allowed)}")
        elif fired.cron is None:
            problems.append(f"{key}: fired by revision {fired.revision}, which is disabled")
        elif at not in occurrences_between(to_spec(fired.cron), at, at + timedelta(seconds=1)):
            problems.append(f"{key}: not an instant of {fired.cron!r} (revision {fired.revision})")
    return problems


def read_revisions(store_url: str) -> dict[str, int | None]:
    """Each run row's ``revision`` (the schedules table's revision that fired it)."""
    engine = sa.create_engine(store_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT id, revision FROM _voltro_schedule_runs"))
            return {key: revision for key, revision in found}
    finally:
        engine.dispose()


def problems_no_duplicates(executions: Sequence[Execution]) -> list[str]:
    """Executions that share an occurrence or a task id, and executions missing the headers."""
    problems: list[str] = []
    for what, values in (
        ("occurrence", [e.occurrence for e in executions]),
        ("task id", [e.task_id for e in executions]),
    ):
        problems += [f"{what} {v} executed {n} times" for v, n in Counter(values).items() if n > 1]
    for e in executions:
        if e.occurrence is None:
            problems.append(f"execution {e.task_id} carries no voltro_occurrence header")
        elif e.task_id != task_id_for(e.occurrence):
            problems.append(f"execution {e.occurrence}: task id {e.task_id} is not uuid5(key)")
        elif e.periodic_task_name != e.occurrence.rpartition("@")[0]:
            problems.append(f"execution {e.occurrence}: periodic_task_name {e.periodic_task_name}")
    return problems


def check(problems: Sequence[str], what: str, limit: int = 30) -> None:
    """Fail with a readable list if there is any problem."""
    if problems:
        shown = "\n  ".join(problems[:limit])
        more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
        raise AssertionError(f"{what}: {len(problems)} problem(s)\n  {shown}{more}")


# -- private services ---------------------------------------------------------------------


class PrivateRedis:
    """A ``redis-server`` of the test's own, on a free port, with an fsync-always AOF so that
    a stop and restart loses nothing the broker had accepted."""

    def __init__(self, workdir: Path, procs: ProcessSet) -> None:
        self.workdir = workdir
        self.procs = procs
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Proc | None = None
        self._starts = 0

    def start(self) -> None:
        self._starts += 1
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--daemonize", "no",
        ]  # fmt: skip
        self.proc = self.procs.start(
            "redis",
            argv,
            env=os.environ,
            cwd=self.workdir,
            log=self.workdir / f"redis.{self._starts}.log",
        )
        if not wait_until(self._answers, timeout=20):
            raise RuntimeError(f"private redis did not start:\n{self.proc.tail()}")

    def stop(self) -> None:
        """A clean service stop (SIGTERM: Redis flushes its AOF and exits)."""
        assert self.proc is not None
        self.proc.stop(timeout=20)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False


def require_binary(*programs: str) -> None:
    """Fail under ``CI=true``, skip loudly otherwise, if one of ``programs`` is missing."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        message = f"ACCEPTANCE TEST NEEDS PROGRAMS THAT ARE MISSING: {missing}"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(f"!!! {message} -- SKIPPING; install them or set CI=true to fail")


def start_private_redis(made: Deployments) -> PrivateRedis:
    """Start a :class:`PrivateRedis` among ``made``'s processes, in its work dir."""
    require_binary("redis-server")
    redis = PrivateRedis(made.workdir, made.procs)
    redis.start()
    return redis


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb in a temp dir), never the shared one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.libpq_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.url = sqlalchemy_url(self.libpq_url)

    def _as_postgres(self, *argv: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return run_checked([*prefix, *argv])

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._as_postgres(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c full_page_writes=off"
        )
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"
        )

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        if self.running():
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def private_postgres_cluster(prefix: str = "vbt-acc-pg-") -> Iterator[PrivatePostgres]:
    """A started :class:`PrivatePostgres`, destroyed afterwards."""
    require_binary(str(PG_BIN / "initdb"), "runuser")
    # Its own temp dir, directly under /tmp: the postgres user must be able to reach it.
    with temp_dir(prefix) as root:
        cluster = PrivatePostgres(root)
        try:
            cluster.init()
            cluster.start()
            yield cluster
        finally:
            cluster.destroy()


# -- scenario steps -----------------------------------------------------------------------


def window_start(lead: float = 1.0) -> datetime:
    """A whole second at least ``lead`` seconds from now: the start of an observed window."""
    return now().replace(microsecond=0) + timedelta(seconds=1 + lead)


@dataclass(frozen=True)
class Outcome:
    """What a scenario left behind: the occurrences expected in its window, the run rows and
    the executions."""

    keys: list[str]
    runs: dict[str, Run]
    executions: list[Execution]

    def keys_of(self, schedule: str) -> list[str]:
        return [k for k in self.keys if k.rpartition("@")[0] == schedule]

    def executed(self, key: str) -> int:
        return sum(1 for e in self.executions if e.occurrence == key)


def finish(dep: Deployment, schedules: Sequence[Sched], start: datetime, end: datetime) -> Outcome:
    """Let the occurrences before ``end`` go out, stop every replica, wait for the worker."""
    sleep_until(end + timedelta(seconds=1.5))
    dep.stop_beats()
    keys = expected_keys(schedules, start, end)
    dep.drain(keys)
    return Outcome(keys, dep.runs(), dep.executions())


def keys_in(keys: Iterable[str], lo: datetime, hi: datetime) -> list[str]:
    """The keys whose instant lies in ``[lo, hi)``."""
    return [k for k in keys if lo <= scheduled_at(k) < hi]


def problems_missed(keys: Iterable[str], outcome: Outcome, reasons: set[str]) -> list[str]:
    """What breaks "each of ``keys`` is recorded missed (for one of ``reasons``), never run"."""
    problems = []
    for key in keys:
        run = outcome.runs.get(key)
        if run is None or run.status != "missed" or run.reason not in reasons:
            shown = run and (run.status, run.reason)
            problems.append(f"{key}: should be missed ({'/'.join(sorted(reasons))}): {shown}")
        elif run.coordination_outcome != "won_lock":
            problems.append(f"{key}: missed outside the gate ({run.coordination_outcome})")
        if outcome.executed(key):
            problems.append(f"{key}: executed {outcome.executed(key)}x, though due to be missed")
    return problems


def problems_missed_or_once(keys: Iterable[str], outcome: Outcome, reasons: set[str]) -> list[str]:
    """For occurrences whose fate depends on timing: missed and never run, or run once."""
    keys = list(keys)
    missed = [k for k in keys if k in outcome.runs and outcome.runs[k].status == "missed"]
    once = [k for k in keys if k not in missed]
    return problems_missed(missed, outcome, reasons) + problems_exactly_once(
        once, outcome.runs, outcome.executions
    )


def problems_not_before(keys: Iterable[str], outcome: Outcome, back: datetime) -> list[str]:
    """What breaks "none of ``keys`` was published or executed before ``back``"."""
    problems = []
    for key in keys:
        run = outcome.runs.get(key)
        if run is not None and run.published_at is not None and run.published_at < back:
            problems.append(f"{key}: published at {run.published_at:%T.%f}, before {back:%T.%f}")
        problems += [
            f"{key}: executed at {e.executed_at:%T.%f}, before {back:%T.%f}"
            for e in outcome.executions
            if e.occurrence == key and e.executed_at < back
        ]
    return problems
