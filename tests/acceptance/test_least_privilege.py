"""Three beat replicas and a worker (with the run ledger attached) on PostgreSQL under the
beat role of deploy/postgresql/roles.sql, the schema upgraded by the migrator role and
``voltro_beat_migrate`` off: every occurrence runs exactly once and the worker records its
outcome, while a statement outside the role's rights fails."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from vbt_harness import (
    EVERY_2S,
    EVERY_SECOND,
    REPLICAS,
    Deployments,
    Sched,
    check,
    finish,
    problems_exactly_once,
    problems_no_duplicates,
    sqlalchemy_url,
    wait_until,
    window_start,
)

from voltro_beat.store.tables import runs


def test_replicas_and_a_worker_run_under_the_least_privilege_role(
    deployment: Deployments, least_privilege_roles: Callable[[str], Any]
) -> None:
    roles = least_privilege_roles(sqlalchemy_url(deployment.exec_db))
    beat_url = roles.url(roles.beat)
    upgrade = subprocess.run(
        [Path(sys.executable).parent / "voltro-beat", "db", "upgrade"],
        env={"VOLTRO_BEAT_STORE_URL": roles.url(roles.migrator)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert upgrade.returncode == 0, upgrade.stderr

    # Fired by `voltro-beat trigger` only: its occurrence at `anchor` stands for the test's run.
    anchor = datetime.now(UTC).replace(microsecond=0)
    nightly = Sched(
        "nightly",
        "timedelta(days=1)",
        {"trigger": '"external"', "anchor": f"datetime.fromisoformat({anchor.isoformat()!r})"},
    )
    schedules = [EVERY_SECOND, EVERY_2S]
    dep = deployment(store=beat_url, app="vbt_admin_proj")
    dep.configure([*schedules, nightly], voltro_beat_migrate=False)
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    start = window_start()
    end = start + timedelta(seconds=8)
    # Two triggers at once (a CronJob that made two Jobs), under the beat role.
    argv = [
        Path(sys.executable).parent / "voltro-beat",
        "trigger",
        "nightly",
        "-A",
        "vbt_admin_proj",
    ]
    triggers = [
        subprocess.Popen(argv, env=dep.env(), cwd=dep.workdir, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    answers = sorted(p.communicate(timeout=60)[0].partition(": ")[2].strip() for p in triggers)
    assert [p.returncode for p in triggers] == [0, 0]
    assert answers[0] == "claimed already, nothing published", answers
    outcome = finish(dep, schedules, start, end)
    key = f"nightly@{anchor:%Y-%m-%dT%H:%M:%S}"
    assert wait_until(lambda: any(e.occurrence == key for e in dep.executions()), timeout=30)
    assert sum(e.occurrence == key for e in dep.executions()) == 1
    assert dep.runs()[key].coordination_outcome == "external"

    check(problems_exactly_once(outcome.keys, outcome.runs, outcome.executions), "occurrences")
    check(problems_no_duplicates(outcome.executions), "executions")
    assert len({outcome.runs[k].replica for k in outcome.keys}) > 1

    def recorded() -> bool:
        statuses = {k: r.status for k, r in dep.runs().items() if k in outcome.keys}
        return set(statuses.values()) == {"succeeded"}

    assert wait_until(recorded, timeout=30), "the worker did not record every run succeeded"
    logs = "\n".join(p.text() for p in [*dep.beats.values(), dep.worker] if p is not None)
    assert "permission denied" not in logs

    engine = sa.create_engine(beat_url, poolclass=sa.NullPool)
    try:
        for statement in (f"DROP TABLE {runs.name}", "CREATE TABLE sneaky (id int)"):
            with (
                pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"),
                engine.begin() as conn,
            ):
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()
