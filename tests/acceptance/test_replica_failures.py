"""Replicas that die or all stop: no duplicate, no gap, catch-up as each entry's policy says."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from vbt_harness import (
    EVERY_2S,
    EVERY_SECOND,
    REPLICAS,
    Deployments,
    Outcome,
    Sched,
    check,
    finish,
    next_boundary,
    now,
    problems_exactly_once,
    problems_missed,
    problems_missed_or_once,
    problems_no_duplicates,
    scheduled_at,
    sleep_until,
    window_start,
)


def test_kill_minus_nine_of_one_replica_leaves_no_duplicate_and_no_gap(
    deployment: Deployments,
) -> None:
    schedules = [EVERY_SECOND, EVERY_2S]
    dep = deployment()
    # A claimed-but-unpublished row of the victim is republished after this long.
    dep.configure(schedules, voltro_beat_publish_timeout=3, broker_connection_timeout=1)
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()

    # 880 ms past an occurrence: the next one is claimed (250 ms ahead) and not yet published.
    # A kill between a publish and its mark is the business of test_store_outage.py's
    # test_store_failing_between_publish_and_mark_does_not_duplicate.
    start = window_start()
    end = start + timedelta(seconds=22)
    sleep_until(start + timedelta(seconds=8, milliseconds=880))
    # The replica holding a claim ahead, so that its recovery is exercised; else the one
    # that won the most so far, so that the kill takes away a real contributor.
    runs = [r for r in dep.runs().values() if r.scheduled_at >= start]
    held = [r.replica for r in runs if r.status == "claimed" and r.scheduled_at > now()]
    wins = Counter(r.replica for r in runs)
    name = held[0] if held else wins.most_common(1)[0][0]
    assert name in REPLICAS, wins
    victim = dep.beats[name]
    victim.kill9()
    killed_at = now()
    outcome = finish(dep, schedules, start, end)

    assert victim.popen.returncode == -9
    check(problems_exactly_once(outcome.keys, outcome.runs, outcome.executions), "occurrences")
    check(problems_no_duplicates(outcome.executions), "executions")
    runs = [outcome.runs[k] for k in outcome.keys]
    after = {r.replica for r in runs if r.scheduled_at > killed_at + timedelta(seconds=1)}
    assert after and name not in after, (name, after)


EVERY = timedelta(seconds=5)
CATCH_UP = {
    policy: Sched(f"catch-up-{policy}", "timedelta(seconds=5)", {"catch_up": repr(policy)})
    for policy in ("latest", "skip", "all")
}
STOPPED_FOR = timedelta(seconds=20)
#: voltro_beat_publish_timeout (the default): at boot, occurrences younger than this are not
#: downtime and are published whatever the policy (a live replica may be about to claim them).
ON_TIME = timedelta(seconds=10)


def test_restart_after_a_20s_stop_catches_up_as_each_policy_says(
    deployment: Deployments,
) -> None:
    schedules = list(CATCH_UP.values())
    dep = deployment()
    dep.configure(schedules)
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()

    # Stop half a second after a 5 s boundary (its occurrence is out by then) and restart just
    # after one, so that the replicas usually finish booting before the next occurrence.
    start = window_start()
    stop_at = next_boundary(start + 2 * EVERY, EVERY, timedelta(milliseconds=500))
    sleep_until(stop_at)
    dep.stop_beats()
    stopped = now()
    before = dep.runs().values()
    last = {s.name: max(r.scheduled_at for r in before if r.schedule == s.name) for s in schedules}
    restart = next_boundary(stopped + STOPPED_FOR, EVERY, timedelta(milliseconds=200))
    sleep_until(restart)
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    booted = now()
    end = booted + 2 * EVERY
    outcome = finish(dep, schedules, start, end)

    problems = problems_no_duplicates(outcome.executions)
    for policy, sched in CATCH_UP.items():
        keys = outcome.keys_of(sched.name)
        ran = [k for k in keys if scheduled_at(k) <= last[sched.name]]
        gap = [k for k in keys if last[sched.name] < scheduled_at(k) < restart]
        unsure = [k for k in keys if restart <= scheduled_at(k) < booted]
        after = [k for k in keys if scheduled_at(k) >= booted]
        assert len(ran) >= 2 and len(gap) >= 3 and after, (policy, ran, gap, after)
        problems += problems_exactly_once(ran + after, outcome.runs, outcome.executions)
        problems += _catch_up_problems(policy, gap, unsure, outcome, restart, booted)
    check(problems, f"stopped {stopped:%H:%M:%S.%f}, restarted {restart:%H:%M:%S.%f}")


def _catch_up_problems(
    policy: str,
    gap: list[str],
    unsure: list[str],
    outcome: Outcome,
    restart: datetime,
    booted: datetime,
) -> list[str]:
    """Check the occurrences no replica ran while all were stopped against ``policy``.

    ``gap`` happened before the restart, so every replica's boot saw them all; ``unsure``
    happened while the replicas were booting, so a replica may have counted them as missed
    (it booted after them) or fired them normally (before): either is fine, once. Those less
    than :data:`ON_TIME` old at every boot are published whatever the policy; those that were
    so at some boots only may go either way.
    """
    on_time = [k for k in gap if scheduled_at(k) > booted - ON_TIME]
    maybe = [k for k in gap if restart - ON_TIME < scheduled_at(k) <= booted - ON_TIME]
    stale = [k for k in gap if scheduled_at(k) <= restart - ON_TIME]
    if policy == "all":
        published, missed, either = gap + unsure, [], []
    elif policy == "skip":
        published, missed, either = on_time, stale, maybe + unsure
    else:  # latest: the newest occurrence a booting replica saw runs if none was on time
        newest = [] if on_time else gap[-1:]
        published = on_time
        missed = [k for k in stale if k not in newest]
        either = [k for k in maybe if k not in missed] + newest + unsure
        either = list(dict.fromkeys(either))
    problems = problems_exactly_once(published, outcome.runs, outcome.executions)
    problems += problems_missed(missed, outcome, {"catch_up"})
    problems += problems_missed_or_once(either, outcome, {"catch_up"})
    if policy == "latest" and not any(outcome.executed(k) for k in published + either):
        problems.append(f"none of {published + either} was published")
    return [f"{policy}: {p}" for p in problems]
