"""Fixtures of the chaos suite: a deployment per scenario (from the acceptance harness), a
private Redis broker, the proxies, and the session's summary table.

The acceptance harness (``tests/acceptance/vbt_harness.py``, ``vbt_proj.py``) is imported as
is. Every process runs in its own process group and is killed in a finaliser; temp dirs are
removed unless ``VBT_KEEP=1``. The summary rows go to ``tests/chaos/results/summary.json``
(git-ignored) at the end of the session; ``python -m tests.chaos.report --update-docs`` puts
them into ``docs/guarantees.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "acceptance"))

from chaos_harness import ChaosDeployments, Results
from tcp_proxy import ProxyHub
from vbt_harness import PrivatePostgres, deployments, failed, private_postgres_cluster


@pytest.fixture(scope="session")
def chaos_results() -> Iterator[Results]:
    """Collects each scenario's :class:`~chaos_harness.Tally`; written at the session's end."""
    results = Results()
    yield results
    path = results.write()
    if path is not None:
        print(f"\nchaos summary written to {path}")


@pytest.fixture
def chaos(request: pytest.FixtureRequest, need: Callable[..., None]) -> Iterator[ChaosDeployments]:
    """Build the scenario's deployment: ``chaos(broker=redis.url)``; a private Redis comes
    from :func:`vbt_harness.start_private_redis` on ``chaos`` itself."""
    with deployments(
        need, lambda: failed(request), prefix="vbt-chaos-", factory=ChaosDeployments
    ) as made:
        assert isinstance(made, ChaosDeployments)
        yield made


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the test's own; request it before ``chaos`` so that it outlives
    the deployment's processes."""
    with private_postgres_cluster("vbt-chaos-pg-") as cluster:
        yield cluster


@pytest.fixture
def proxies() -> Iterator[ProxyHub]:
    hub = ProxyHub()
    try:
        yield hub
    finally:
        hub.close()
