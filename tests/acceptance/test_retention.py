"""Retention with real ``celery beat -S voltro`` replicas: ``register_retention`` called from
the Celery app module before beat boots, the boot lines each replica logs, and one sweep for
the hour among three replicas (its claim only in the claims table, never a run)."""

from __future__ import annotations

import sqlalchemy as sa
from vbt_harness import EVERY_SECOND, REPLICAS, Deployments, wait_until

PRECEDENCE = "An app registration wins over a plugin's, and a plugin's over a framework default."
#: Appended to the config file vbt_proj runs when it is imported: the app module's own code.
REGISTER = """
from voltro_beat import register_retention
register_retention(table="_voltro_schedule_claims", time_column="claimed_at", ttl=1)
"""


def test_three_replicas_arm_the_apps_policy_and_sweep_once(deployment: Deployments) -> None:
    dep = deployment(store="postgresql", broker="redis")
    dep.configure([EVERY_SECOND])
    with dep.config_file.open("a") as config:
        config.write(REGISTER)
    dep.start_beats(*REPLICAS)
    dep.wait_ready()

    engine = sa.create_engine(dep.store_url)

    def sweeps() -> list[tuple[str, str]]:
        with engine.connect() as conn:
            return [
                (key, replica)
                for key, replica in conn.execute(
                    sa.text(
                        "SELECT id, replica FROM _voltro_schedule_claims"
                        " WHERE schedule = 'voltro-beat:retention'"
                    )
                )
            ]

    try:
        assert wait_until(lambda: bool(sweeps()), timeout=30)
        dep.stop_beats()
        claimed = sweeps()
        with engine.connect() as conn:
            runs = conn.execute(
                sa.text("SELECT count(*) FROM _voltro_schedule_runs WHERE schedule LIKE 'voltro%'")
            ).scalar_one()
    finally:
        engine.dispose()
    # Every replica tried the hour's slot at boot; one won it. (A boot straddling the hour
    # could claim two slots, each once.)
    assert len({key for key, _ in claimed}) == len(claimed) <= 2
    assert runs == 0
    for name in REPLICAS:
        log = dep.beats[name].text()
        lines = [line.partition("] ")[2] for line in log.splitlines()]
        start = lines.index("retention: 2 policy(ies) armed")
        assert lines[start : start + 4] == [
            "retention: 2 policy(ies) armed",
            "  _voltro_schedule_claims: 1h by claimed_at (app)",
            "! _voltro_schedule_claims: two registrations — kept the app's 1h, dropped the "
            f"framework's 24h. {PRECEDENCE}",
            "  _voltro_schedule_runs: 30d by scheduled_at (framework)",
        ], log
