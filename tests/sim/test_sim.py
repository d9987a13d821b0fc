"""The simulation in the test suite: the seeds that once found a bug, then fresh seeds for a
budget of wall time (``VOLTRO_SIM_BUDGET`` seconds, 45 by default; the long mode is
``python -m tests.sim --seeds 10000``, see tests/sim/README.md).

A failing seed prints its violations, a minimal trace and the command that replays it; add it
to ``REGRESSIONS`` below once the bug it found is fixed.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os

import pytest

from tests.sim.__main__ import report, run
from tests.sim.scenario import simulate

#: Seeds that found a bug (the commit that fixed it says which): replayed on every run.
REGRESSIONS = (
    9,  # catch-up of a schedule another live replica runs
    17,  # cluster: a shard taken from a replica that stopped, caught up on as if all were down
    16,  # close() on top of a tick; a duplicate delivery after a failure; SQLite's dropped lock
    18,  # close() spinning on a past claim time
    24,  # close() on top of a tick waiting for SQLite's busy timeout
    280,  # SIGTERM in the retry of a failed mark dropped the runs waiting for it
    443,  # a chunk whose fence found nothing of it, fenced again: max() of nothing
    745,  # a redelivery after the retention swept its row (the documented window)
    1067,  # cluster: SQLite's heartbeat judged who was live after a pause, leaving itself out
    1378,  # the last replica stopping as the calm spell began, none booted to recover
    1597,  # cluster: a replica behind its schedules released them, the taker called it downtime
    757,  # cluster: the same (1597 no longer reaches it): fails without the release-time bound
    3887,  # cluster, the invariant's: a replica gone from the registry counted live for a
    4381,  # shard another replica owned (that owner stalled: downtime for its schedules)
    8074,  # a queue backlog's runs past their lateness left queued until their turn
    9004,  # the scenario's: deploys ending after the calm began left no replica
    111,  # the invariant's: a replica leaving the registry as another joined counted live
    1984,  # the invariant's: a retried boot judged at its last join, not its first (owed then)
    7146,  # a second SIGTERM while beat waited for its last mark ended it mid-mark
    11,  # cluster: a replica whose claims failed kept renewing its shard: none of it fired
)


@pytest.fixture(autouse=True)
def _quiet() -> object:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("seed", REGRESSIONS)
def test_a_seed_that_found_a_bug(seed: int) -> None:
    result = simulate(seed)
    assert result.ok, report(result)


@pytest.mark.parametrize(("seed", "batch"), [(18, 4), (49, 8), (801, 4), (2, 4), (7, 4), (11, 2)])
def test_a_seed_whose_bursts_take_several_claim_statements(
    seed: int, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--claim-batch``: a step claims at most ``batch`` occurrences, the rest in the next
    steps. 18 and 49 found steps that left the rest counted as steps past it, 801 a message
    still queued at the end behind a slow worker's backlog counted as lost (both the
    invariants')."""
    from voltro_beat.engine import recorder

    monkeypatch.setattr(recorder, "BATCH", batch)
    result = simulate(seed)
    assert result.ok, report(result)


def test_a_seed_replays_step_for_step() -> None:
    def digest() -> str:
        trace = "\n".join(str(event) for event in simulate(REGRESSIONS[0]).trace)
        return hashlib.sha1(trace.encode()).hexdigest()

    assert digest() == digest()


def test_fresh_seeds_for_the_budget() -> None:
    budget = float(os.environ.get("VOLTRO_SIM_BUDGET", "45"))
    args = argparse.Namespace(
        seed=None,
        budget=budget,
        seeds=0,
        first=1,
        jobs=min(2, os.cpu_count() or 1),
        trace=False,
        progress=0,
        until_failure=False,
    )
    summary = run(args)
    print(f"simulated {summary.seeds} fresh seeds, {summary.steps:,} steps")
    assert summary.seeds > 0
    assert not summary.failed, "\n\n".join(report(result) for result in summary.failed)


def test_every_teeth_mutant_still_applies() -> None:
    """``python -m tests.sim.teeth`` reverts each fix textually: each revert must still find
    the text it replaces in today's code."""
    from tests.sim.teeth import MUTANTS, ROOT

    for finding, _, changes in MUTANTS:
        for path, before, _ in changes:
            assert before in (ROOT / path).read_text(), f"finding {finding}: {path}"
