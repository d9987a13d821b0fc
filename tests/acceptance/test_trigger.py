"""The external trigger end to end (issue 13): ``voltro-beat trigger`` and ``voltro-beat
serve-trigger`` processes, a real worker, Redis, on PostgreSQL and on SQLite.

* two triggers started together for one occurrence publish it once, under ``advisory_lock``
  and under ``single`` (the claims table is used whatever the coordination); a third says so
  and exits 0; the worker runs it once, with the usual task id and headers, outcome
  ``external``;
* an arrival too far from any occurrence exits 3 and records nothing;
* a beat replica never fires an external entry, not even in its catch-up at boot;
* the arrival snaps back to the newest occurrence: exactly on one, 1 ms before the next less
  the clock offset; an arrival 300 ms early stands for the coming one, sent at its instant;
* HTTP: a missing or wrong token is 401 and publishes nothing; 404, 422, 202 and 200 as the
  docs say; the token appears in no line the server logged.
"""

from __future__ import annotations

import runpy
import socket
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from celery import Celery
from vbt_harness import (
    EVERY_SECOND,
    Deployment,
    Deployments,
    Sched,
    check,
    free_port,
    now,
    problems_exactly_once,
    problems_no_duplicates,
    wait_until,
)

from voltro_beat.exceptions import NotPublished, TooFar
from voltro_beat.occurrences import occurrence_key
from voltro_beat.trigger import Trigger

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

VOLTRO_BEAT = Path(sys.executable).parent / "voltro-beat"
STORES = ["postgresql", "sqlite"]
TOKEN = "tr1gger-t0ken-Zq8"
EXIT_TOO_FAR = 3


def source(instant: datetime) -> str:
    return f"datetime.fromisoformat({instant.isoformat()!r})"


def external(name: str, schedule: str, **extra: str) -> Sched:
    return Sched(name, schedule, {"trigger": '"external"', **extra})


def daily(name: str, anchor: datetime, **extra: str) -> Sched:
    """External, once a day at ``anchor``'s time of day: every trigger of the test's few
    minutes stands for the occurrence at ``anchor``."""
    return external(name, "timedelta(days=1)", anchor=source(anchor), **extra)


def trigger(dep: Deployment, name: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(VOLTRO_BEAT), "trigger", name, "-A", "vbt_proj"],
        env=dep.env(**env),
        cwd=dep.workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def together(dep: Deployment, name: str, **env: str) -> list[tuple[int, str, str]]:
    """Two triggers of ``name`` started at once (a CronJob that created two Jobs)."""
    procs = [trigger(dep, name, **env), trigger(dep, name, **env)]
    return [finish(p) for p in procs]


def claims(store_url: str) -> set[str]:
    engine = sa.create_engine(store_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text("SELECT id FROM _voltro_schedule_claims")).scalars())
    finally:
        engine.dispose()


def assert_once_published(results: list[tuple[int, str, str]], key: str) -> None:
    assert [code for code, _, _ in results] == [0, 0], results
    outputs = sorted(out.strip() for _, out, _ in results)
    assert outputs[0] == f"{key}: claimed already, nothing published", results
    assert outputs[1].startswith(f"{key}: published (task id "), results


@pytest.mark.parametrize("store", STORES)
def test_cli_trigger_publishes_each_occurrence_once(deployment: Deployments, store: str) -> None:
    anchor = now().replace(microsecond=0) - timedelta(minutes=1)
    schedules = [
        EVERY_SECOND,
        daily("nightly", anchor),
        daily("nightly-single", anchor),
        external("ext-every-second", '"* * * * * *"'),
        # Its last occurrence was two hours ago, and it may be ten minutes late at most.
        daily("late", anchor - timedelta(hours=2), max_lateness="600"),
    ]
    dep = deployment(store=store)
    dep.configure(schedules)
    dep.start_worker()
    dep.start_beats("r1")
    dep.wait_ready()

    nightly = occurrence_key("nightly", anchor)
    assert_once_published(together(dep, "nightly"), nightly)
    # The duplicate comes from the platform: ``single`` coordination still claims.
    single = occurrence_key("nightly-single", anchor)
    assert_once_published(
        together(dep, "nightly-single", VOLTRO_BEAT_COORDINATION="single"), single
    )
    # The platform retried: nothing published, exit 0 (it must not retry again).
    code, out, _ = finish(trigger(dep, "nightly"))
    assert (code, out.strip()) == (0, f"{nightly}: claimed already, nothing published")

    code, out, err = finish(trigger(dep, "late"))
    assert code == EXIT_TOO_FAR, (out, err)
    assert err.startswith("Error: late: no occurrence within max_lateness (0:10:00)"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for name, says in (("nope", "no schedule 'nope'"), ("every-second", "is fired by beat")):
        code, out, err = finish(trigger(dep, name))
        assert code == 1 and says in err and len(err.strip().splitlines()) == 1, (out, err)

    # The every-second external entry gets a history, then a replica boots (catch-up runs)
    # and beats on: neither fires it.
    code, out, err = finish(trigger(dep, "ext-every-second"))
    assert code == 0, (out, err)
    ext_key = out.strip().split(": published", 1)[0]
    dep.stop_beats("r1")
    restarted = now()
    dep.start_beats("r2")
    dep.wait_ready()

    def beat_went_on() -> bool:
        return (
            sum(
                1
                for r in dep.runs().values()
                if r.schedule == EVERY_SECOND.name
                and r.replica == "r2"
                and r.claimed_at
                and r.claimed_at > restarted
            )
            >= 3
        )

    assert wait_until(beat_went_on, timeout=30), "beat r2 fired nothing after its boot"
    dep.stop_beats()
    keys = [nightly, single, ext_key]
    dep.drain(keys)

    runs, executions = dep.runs(), dep.executions()
    check(problems_exactly_once(keys, runs, executions, outcome="external"), "triggered")
    check(problems_no_duplicates(executions), "executions")
    by_schedule = {
        name: [k for k, r in runs.items() if r.schedule == name]
        for name in ("nightly", "nightly-single", "ext-every-second", "late")
    }
    assert by_schedule == {
        "nightly": [nightly],
        "nightly-single": [single],
        "ext-every-second": [ext_key],
        "late": [],
    }
    assert {nightly, single, ext_key} <= claims(dep.store_url)
    assert {r.coordination_outcome for r in runs.values() if r.schedule == EVERY_SECOND.name} == {
        "won_lock"
    }
    assert dep.queue_length() == 0


def in_process_trigger(dep: Deployment, **conf: str) -> Trigger:
    """A trigger of the deployment's app, in this process (so that a test can give the
    arrival); ``conf`` overrides its configuration."""
    app = Celery("vbt_trigger_test", set_as_current=False)
    app.conf.update(runpy.run_path(str(dep.config_file))["CONFIG"])
    app.conf.update(voltro_beat_store_url=dep.store_url, voltro_beat_replica="test-trigger")
    app.conf.update(conf)
    return Trigger(app)


@pytest.mark.parametrize("store", STORES)
def test_arrivals_snap_back_to_the_newest_occurrence(deployment: Deployments, store: str) -> None:
    hourly = {"max_lateness": "7200"}
    dep = deployment(store=store)
    dep.configure(
        [
            external("edge-on", "timedelta(hours=1)", **hourly),
            external("edge-next", "timedelta(hours=1)", **hourly),
            external("edge-far", "timedelta(hours=1)", max_lateness="600"),
            external("edge-early", "timedelta(seconds=5)"),
        ]
    )
    dep.start_worker()
    dep.wait_ready()
    fire = in_process_trigger(dep)
    try:
        hour = fire.store.database.time().replace(minute=0, second=0, microsecond=0)
        ms = timedelta(milliseconds=1)
        offset = timedelta(seconds=1)  # voltro_beat_max_clock_offset
        on = fire.fire("edge-on", arrival=hour)
        # 1 ms before the next one less the clock offset: still this one.
        next_ = fire.fire("edge-next", arrival=hour + timedelta(hours=1) - offset - ms)
        again = fire.fire("edge-on", arrival=hour + timedelta(minutes=30))
        with pytest.raises(TooFar):
            fire.fire("edge-far", arrival=hour + timedelta(minutes=10) + ms)
        # A platform whose clock runs 300 ms ahead: its arrival is the coming occurrence
        # (before the fix: the previous one, found claimed or too far, and this one got no
        # row), published at its instant on the database's clock, not before.
        now = fire.store.database.time()
        coming = now.replace(microsecond=0) + timedelta(seconds=5 - now.second % 5)
        early = fire.fire("edge-early", arrival=coming - 300 * ms)
    finally:
        fire.close()
    keys = [occurrence_key("edge-on", hour), occurrence_key("edge-next", hour)]
    assert [on.occurrence.key, next_.occurrence.key] == keys
    assert (on.published, next_.published, again.published) == (True, True, False)
    assert again.occurrence.key == keys[0]
    assert (early.occurrence.key, early.published) == (occurrence_key("edge-early", coming), True)
    keys.append(early.occurrence.key)
    dep.drain(keys)
    runs, executions = dep.runs(), dep.executions()
    check(problems_exactly_once(keys, runs, executions, outcome="external"), "snapped")
    assert sorted(runs) == sorted(keys)  # nothing of edge-far
    assert runs[early.occurrence.key].published_at >= coming


def wait_listening(port: int, dep: Deployment) -> None:
    def accepts() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    if not wait_until(accepts, timeout=30):
        raise AssertionError(f"serve-trigger is not listening:\n{dep.procs.tails()}")


@pytest.mark.parametrize("store", STORES)
def test_http_endpoint(deployment: Deployments, store: str) -> None:
    anchor = now().replace(microsecond=0) - timedelta(minutes=1)
    dep = deployment(store=store)
    dep.configure(
        [
            EVERY_SECOND,
            daily("nightly", anchor),
            daily("late", anchor - timedelta(hours=2), max_lateness="600"),
        ]
    )
    dep.start_worker()
    # The token from a file on one store, from the environment on the other.
    if store == "sqlite":
        secret = dep.workdir / "token"
        secret.write_text(TOKEN + "\n")
        token_env = {"VOLTRO_BEAT_TRIGGER_TOKEN_FILE": str(secret)}
    else:
        token_env = {"VOLTRO_BEAT_TRIGGER_TOKEN": TOKEN}
    port = free_port()
    server = dep.procs.start(
        "serve-trigger",
        [str(VOLTRO_BEAT), "serve-trigger", "-A", "vbt_proj", "--port", str(port)],
        env=dep.env(**token_env),
        cwd=dep.workdir,
        log=dep.workdir / "serve-trigger.log",
    )
    wait_listening(port, dep)
    dep.wait_ready()
    url = f"http://127.0.0.1:{port}/trigger"
    with httpx.Client(timeout=30) as http:

        def post(name: str, authorization: str | None = f"Bearer {TOKEN}") -> httpx.Response:
            headers = {} if authorization is None else {"Authorization": authorization}
            return http.post(f"{url}/{name}", headers=headers)

        for authorization in (None, "Bearer wrong", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}"):
            assert post("nightly", authorization).status_code == 401, authorization
        # Nothing published, nothing recorded, for a 401 (answered before any I/O).
        assert dep.runs() == {} and dep.queue_length() == 0 and dep.executions() == []

        assert post("nope").status_code == 404
        assert post(EVERY_SECOND.name).status_code == 404
        too_far = post("late")
        assert too_far.status_code == 422 and "max_lateness" in too_far.json()["detail"]
        key = occurrence_key("nightly", anchor)
        first = post("nightly")
        assert (first.status_code, first.json()["key"], first.json()["published"]) == (
            202,
            key,
            True,
        )
        second = post("nightly")
        assert (second.status_code, second.json()["published"]) == (200, False)
    dep.drain([key])
    runs, executions = dep.runs(), dep.executions()
    check(problems_exactly_once([key], runs, executions, outcome="external"), "over HTTP")
    assert sorted(runs) == [key]
    server.stop()
    log = server.text()
    assert "POST /trigger/nightly" in log  # the requests were logged...
    assert TOKEN not in log  # ...and the token nowhere
    assert TOKEN[:-1] not in log


def test_a_trigger_the_broker_refused_is_republished_by_recovery(
    deployment: Deployments,
) -> None:
    """Claimed, but the broker was unreachable: the run stays ``claimed`` (exit 4 from the
    command) and a beat replica's recovery sweep republishes it once its lease ran out."""
    anchor = now().replace(microsecond=0) - timedelta(minutes=1)
    dep = deployment(store="postgresql")
    dep.configure([daily("nightly", anchor)])
    dep.start_worker()
    dep.wait_ready()
    # Nothing listens on port 1: the broker write fails at once.
    fire = in_process_trigger(dep, broker_url="redis://127.0.0.1:1/0")
    try:
        with pytest.raises(NotPublished, match="recovery sweep republishes it"):
            fire.fire("nightly")
    finally:
        fire.close()
    key = occurrence_key("nightly", anchor)
    assert dep.runs()[key].status == "claimed"
    assert dep.executions() == []
    dep.start_beats("r1")
    dep.drain([key])
    runs, executions = dep.runs(), dep.executions()
    check(problems_exactly_once([key], runs, executions, outcome="external"), "recovered")
    assert runs[key].replica == "r1"  # taken over by the beat replica
