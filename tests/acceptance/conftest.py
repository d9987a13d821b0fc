"""Fixtures of the acceptance tests: real beat replicas, a worker, private services.

The service check is ``need`` from ``tests/conftest.py`` (fails under ``CI=true``, skips
loudly otherwise). Every process is started in its own process group and killed in a
finaliser; every temp dir is removed afterwards (set ``VBT_KEEP=1`` to keep them, with the
logs, for debugging). When a test fails, the tails of its process logs are printed in its
teardown section.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from vbt_harness import (
    Deployments,
    PrivatePostgres,
    deployments,
    failed,
    private_postgres_cluster,
)

Need = Callable[..., None]


@pytest.fixture
def deployment(request: pytest.FixtureRequest, need: Need) -> Iterator[Deployments]:
    """Build the test's deployment: ``deployment(store="sqlite", broker="rabbitmq")``."""

    with deployments(need, lambda: failed(request)) as made:
        yield made


@pytest.fixture(scope="module")
def module_deployment(request: pytest.FixtureRequest, need: Need) -> Iterator[Deployments]:
    """:func:`deployment` shared by the tests of a module (one scenario, several checks)."""
    before = request.session.testsfailed
    with deployments(need, lambda: request.session.testsfailed > before) as made:
        yield made


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the test's own (initdb, started), destroyed afterwards."""
    with private_postgres_cluster() as cluster:
        yield cluster
