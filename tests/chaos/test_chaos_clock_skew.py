"""Clock skew: two of three replicas run under libfaketime, one 5 s fast, one 5 s slow.

With ``voltro_beat_clock = "database"`` every decision that compares instants uses the
store's clock, so the skew must change nothing: no duplicate, no execution before its instant,
no occurrence recorded ``missed`` before its instant plus ``max_lateness``. The same run with
``"local"`` shows what local clocks do; it is reported in the summary, not asserted. The
database-clock run is repeated in ``cluster`` coordination, where the restart also hands the
fast replica's shards over and back.

Halfway through the window the fast replica is restarted, so that its boot catch-up runs on
its own clock while the others keep going.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from chaos_harness import (
    LIBFAKETIME,
    PUBLISH_TIMEOUT,
    ChaosDeployments,
    Results,
    boot,
    faketime_env,
    measured_offset,
    redis_accepted,
    require_file,
    tally,
    watching_missed,
)
from vbt_harness import (
    EVERY_SECOND,
    Sched,
    check,
    finish,
    scheduled_at,
    sleep_until,
    start_private_redis,
    window_start,
)

SKEWS = {"fast": "+5s", "slow": "-5s"}
REPLICAS = ("fast", "slow", "true")
#: Short enough that a fast replica's expiry of a late run shows, long enough for a correct one.
SHORT = Sched("short", "timedelta(seconds=2)", {"max_lateness": "3"})
SCHEDULES = [EVERY_SECOND, SHORT]
MAX_LATENESS = {s.name: s.entry().max_lateness for s in SCHEDULES}
WINDOW = timedelta(seconds=20)
RESTART_AT = timedelta(seconds=8, milliseconds=500)


@pytest.mark.parametrize(
    ("clock", "coordination"),
    [("database", "advisory_lock"), ("local", "advisory_lock"), ("database", "cluster")],
)
def test_clock_skew(
    chaos: ChaosDeployments, chaos_results: Results, clock: str, coordination: str
) -> None:
    require_file(LIBFAKETIME, "faketime")
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    dep.wrap = {name: faketime_env(offset) for name, offset in SKEWS.items()}
    offsets = {name: measured_offset(env) for name, env in dep.wrap.items()}
    assert abs(offsets["fast"] - 5) < 1 and abs(offsets["slow"] + 5) < 1, offsets
    boot(dep, SCHEDULES, REPLICAS, voltro_beat_clock=clock, voltro_beat_coordination=coordination)

    with watching_missed(dep) as watcher:
        start = window_start()
        end = start + WINDOW
        sleep_until(start + RESTART_AT)
        dep.restart_beat("fast")
        outcome = finish(dep, SCHEDULES, start, end)
    dead = [n for n, p in dep.beats.items() if p.popen.returncode not in (0, None, -15)]

    row = tally(
        f"1. clock skew +5 s / -5 s, clock={clock}"
        + (", cluster coordination" if coordination == "cluster" else ""),
        outcome,
        max_lateness=MAX_LATENESS,
        missed_seen=watcher.first_seen,
        accepted=redis_accepted(chaos.workdir),
    )
    runs = [outcome.runs[k] for k in outcome.keys if k in outcome.runs]
    won = {name: sum(1 for r in runs if r.replica == name) for name in REPLICAS}
    early = [
        (e.occurrence, (e.executed_at - scheduled_at(e.occurrence)).total_seconds())
        for e in outcome.executions
        if e.occurrence is not None and e.occurrence in set(outcome.keys)
    ]
    worst = min((d for _, d in early), default=0.0)
    row.notes += [
        f"measured offsets {', '.join(f'{k} {v:+.2f}s' for k, v in offsets.items())};"
        f" publish timeout {PUBLISH_TIMEOUT.total_seconds():g}s, fast replica restarted at"
        f" +{RESTART_AT.total_seconds():g}s of a {WINDOW.total_seconds():g}s window",
        "run rows ending with each replica: " + ", ".join(f"{k} {v}" for k, v in won.items()),
        f"earliest execution {worst:+.3f}s from its instant",
    ]
    if dead:
        row.problems.append(f"replicas exited: {dead}")
    if clock == "local":
        # What local clocks do is the finding, not a failure of the suite.
        chaos_results.add(row, asserted=False)
        return
    chaos_results.add(row)
    check(row.problems, f"clock={clock}, {coordination}")
