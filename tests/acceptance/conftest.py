"""Fixtures of the acceptance tests: real beat replicas, a worker, private services.

The service check is ``require_service`` from ``tests/conftest.py`` (fails under ``CI=true``,
skips loudly otherwise). Every process is started in its own process group and killed in a
finaliser; every temp dir is removed afterwards (set ``VBT_KEEP=1`` to keep them, with the
logs, for debugging). When a test fails, the tails of its process logs are printed in its
teardown section.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from vbt_harness import (
    AMQP_URL,
    PG_BIN,
    POSTGRES_ADMIN_URL,
    REDIS_URL,
    Deployments,
    PrivatePostgres,
    ProcessSet,
    fresh_database,
    require_binary,
)

Need = Callable[..., None]
SERVICES = {
    "postgresql": ("PostgreSQL", POSTGRES_ADMIN_URL),
    "redis": ("Redis", REDIS_URL),
    "rabbitmq": ("RabbitMQ", AMQP_URL),
}


@pytest.fixture(scope="session")
def need(require_service: Callable[[str, str], str]) -> Need:
    """``need("postgresql", "redis", ...)``: fail under CI=true / skip loudly if one is down."""

    def check(*services: str) -> None:
        for service in services:
            require_service(*SERVICES[service])

    return check


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, for the finalisers that print logs on failure."""
    report = yield
    setattr(item, f"vbt_rep_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(
        getattr(getattr(request.node, f"vbt_rep_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if os.environ.get("VBT_KEEP") == "1":
            print(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def deployments(need: Need, show_logs: Callable[[], bool]) -> Iterator[Deployments]:
    """A work dir, a process set and a fresh database on the shared server; all removed after.

    The process logs are printed at the end when ``show_logs()`` says so (a test failed).
    """
    need("postgresql")
    with temp_dir("vbt-acc-") as workdir, fresh_database() as exec_db:
        made = Deployments(workdir, ProcessSet(), exec_db, need=need)
        try:
            yield made
        finally:
            made.close()
            if show_logs():
                print(made.procs.tails())


@pytest.fixture
def deployment(request: pytest.FixtureRequest, need: Need) -> Iterator[Deployments]:
    """Build the test's deployment: ``deployment(store="sqlite", broker="rabbitmq")``."""

    with deployments(need, lambda: _failed(request)) as made:
        yield made


@pytest.fixture(scope="module")
def module_deployment(request: pytest.FixtureRequest, need: Need) -> Iterator[Deployments]:
    """:func:`deployment` shared by the tests of a module (one scenario, several checks)."""
    failed = request.session.testsfailed
    with deployments(need, lambda: request.session.testsfailed > failed) as made:
        yield made


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the test's own (initdb, started), destroyed afterwards."""
    require_binary(str(PG_BIN / "initdb"), "runuser")
    # Its own temp dir, directly under /tmp: the postgres user must be able to reach it.
    with temp_dir("vbt-acc-pg-") as root:
        cluster = PrivatePostgres(root)
        try:
            cluster.init()
            cluster.start()
            yield cluster
        finally:
            cluster.destroy()
