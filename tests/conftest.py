"""Fixtures shared by every test package: services, a fresh PostgreSQL database, workers.

A test that needs a service it cannot reach fails in CI (``CI=true``) and skips locally with a
loud reason. Service addresses can be moved with ``VOLTRO_TEST_POSTGRES``, ``VOLTRO_TEST_REDIS``
and ``VOLTRO_TEST_AMQP``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

#: A database of the PostgreSQL server to connect to for CREATE / DROP DATABASE.
POSTGRES_ADMIN_URL = os.environ.get(
    "VOLTRO_TEST_POSTGRES", "postgresql+psycopg://root@127.0.0.1:5432/postgres"
)
#: Redis server (no database number: each test module picks its own).
REDIS_URL = os.environ.get("VOLTRO_TEST_REDIS", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("VOLTRO_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")

_DEFAULT_PORTS = {"postgresql": 5432, "redis": 6379, "amqp": 5672, "pyamqp": 5672}
VENV_BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent

# Import the working tree's voltro_beat as a regular package, as `python -m pytest` from the
# project root would: an editable install whose finder lists voltro_beat as a namespace
# package would otherwise hide voltro_beat/__init__.py (and so voltro_beat.attach).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def service_url(name: str, url: str) -> str:
    """``url`` if its server accepts a TCP connection, else fail (CI) or skip (locally).

    ``name`` is what the message calls the service, e.g. ``"PostgreSQL"``.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    host = parts.hostname or "127.0.0.1"
    port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    try:
        with socket.create_connection((host, port), timeout=2):
            pass
    except OSError as exc:
        message = f"{name} is unreachable at {host}:{port} ({exc})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true requires every service", pytrace=False)
        pytest.skip(f"!!! {message.upper()} -- SKIPPING; start it or set CI=true to fail")
    return url


@pytest.fixture(scope="module")
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for the requesting test module; dropped at the end.

    Returns ``postgresql+psycopg://root@127.0.0.1:5432/<name>`` (user and server from
    ``VOLTRO_TEST_POSTGRES``).
    """
    admin_url = sa.make_url(service_url("PostgreSQL", POSTGRES_ADMIN_URL))
    module = re.sub(r"[^a-z0-9]+", "_", request.module.__name__.rsplit(".", 1)[-1].lower())
    name = f"vt_{module[:36]}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            # FORCE: a worker killed mid-test may have left a connection behind.
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


class Worker:
    """A ``celery worker`` subprocess in its own process group, logging to a file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
        self.proc = proc
        self.log = log
        self.name = name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the worker logged that it is ready; fail with its log otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.output():
                return
            if self.proc.poll() is not None:
                pytest.fail(f"worker {self.name} exited early:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"worker {self.name} not ready after {timeout}s:\n{self.output()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once, as a crashed host would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 10.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL whatever is left after ``grace`` seconds."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        # The pool children too, even when the main process already exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def start_worker(
    app_module: str,
    *,
    app_dir: Path,
    log: Path,
    name: str,
    args: Sequence[str] = ("-P", "prefork", "-c", "2"),
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 30.0,
) -> Worker:
    """Start ``celery -A app_module worker`` with ``app_dir`` on PYTHONPATH; wait until ready.

    The node is named ``name@<host>``; stop it with :meth:`Worker.stop` in a finaliser, or
    start it through the :func:`celery_worker` fixture, which does.
    """
    environ = dict(os.environ)
    environ.update(env or {})
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(app_dir), str(ROOT), environ.get("PYTHONPATH", "")) if p
    )
    command = [
        str(VENV_BIN / "celery"),
        "-A",
        app_module,
        "worker",
        "-n",
        f"{name}@%h",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
        *args,
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
        )
    worker = Worker(proc, log, name)
    try:
        worker.wait_ready(ready_timeout)
    except BaseException:
        worker.stop()
        raise
    return worker


@pytest.fixture(scope="session")
def require_service() -> Callable[[str, str], str]:
    """:func:`service_url` as a fixture: ``require_service("Redis", url)`` returns ``url``."""
    return service_url


_SERVICES = {
    "postgresql": ("PostgreSQL", POSTGRES_ADMIN_URL),
    "redis": ("Redis", REDIS_URL),
    "rabbitmq": ("RabbitMQ", AMQP_URL),
}


@pytest.fixture(scope="session")
def need() -> Callable[..., None]:
    """``need("postgresql", "redis", ...)``: fail under CI=true / skip loudly if one is down."""

    def check(*services: str) -> None:
        for service in services:
            service_url(*_SERVICES[service])

    return check


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item (``item.vbt_rep_call``...), for the finalisers
    that print process logs when a test failed."""
    report = yield
    setattr(item, f"vbt_rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The RabbitMQ server's URL (its default vhost)."""
    return service_url("RabbitMQ", AMQP_URL)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis server's URL without a database number (append ``/<db>`` of your own)."""
    return service_url("Redis", REDIS_URL).rstrip("/")


@pytest.fixture(scope="module")
def celery_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Worker]]:
    """Start workers with ``celery_worker(app_module, app_dir=..., name=..., ...)``.

    Takes the keyword arguments of :func:`start_worker` (``log`` defaults to a file in a
    temporary directory) and returns the ready :class:`Worker`. Every worker started through
    it is stopped when the requesting module is done, whatever happened to it before.
    """
    started: list[Worker] = []
    logs = tmp_path_factory.mktemp("celery-workers")

    def start(app_module: str, *, name: str, log: Path | None = None, **kwargs: Any) -> Worker:
        worker = start_worker(app_module, name=name, log=log or logs / f"{name}.log", **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in reversed(started):
        worker.stop()


ROLES_SQL = ROOT / "deploy" / "postgresql" / "roles.sql"


@dataclass(frozen=True)
class Roles:
    """The two roles of deploy/postgresql/roles.sql, applied to one database."""

    beat: str
    migrator: str
    #: The database, as a SQLAlchemy URL of the superuser that applies the script.
    admin_url: str

    def url(self, role: str) -> str:
        """The database's SQLAlchemy URL for ``role`` (the test server trusts local logins)."""
        return sa.make_url(self.admin_url).set(username=role).render_as_string(hide_password=False)

    def apply(self) -> None:
        """Run the script with ``psql`` as its header says, the passwords from the
        environment; fail with its output if it fails."""
        psql = shutil.which("psql")
        if psql is None:
            pytest.fail("psql is not installed (Debian: postgresql-client)", pytrace=False)
        libpq = sa.make_url(self.admin_url).set(drivername="postgresql")
        database = libpq.render_as_string(hide_password=False)
        variables = ["ON_ERROR_STOP=1", f"beat_role={self.beat}", f"migrator_role={self.migrator}"]
        result = subprocess.run(
            [psql, "-X", "-q", *(f"--set={v}" for v in variables), "-f", ROLES_SQL, database],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={
                **os.environ,
                "VOLTRO_BEAT_DB_PASSWORD": "beat-secret",
                "VOLTRO_BEAT_MIGRATOR_PASSWORD": "migrator-secret",
            },
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def least_privilege_roles() -> Iterator[Callable[[str], Roles]]:
    """``make(database_url)``: apply deploy/postgresql/roles.sql to that database (as the
    superuser of the URL) with role names of this test's own; the roles are dropped after."""
    made: list[Roles] = []

    def make(database_url: str) -> Roles:
        suffix = uuid.uuid4().hex[:8]
        roles = Roles(f"vt_beat_{suffix}", f"vt_migrator_{suffix}", database_url)
        made.append(roles)
        roles.apply()
        return roles

    yield make
    for roles in made:
        quoted = f'"{roles.beat}", "{roles.migrator}"'
        engine = sa.create_engine(roles.admin_url, poolclass=sa.NullPool)
        # The database may be dropped already (fixtures end in either order).
        with contextlib.suppress(sa.exc.OperationalError), engine.begin() as conn:
            conn.exec_driver_sql(f'REASSIGN OWNED BY "{roles.migrator}" TO CURRENT_USER')
            conn.exec_driver_sql(f"DROP OWNED BY {quoted}")
        engine.dispose()
        admin = sa.create_engine(POSTGRES_ADMIN_URL, poolclass=sa.NullPool)
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {quoted}")
        admin.dispose()
