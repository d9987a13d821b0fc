"""The run ledger end to end: real prefork workers, PostgreSQL and Redis (broker + counters).

Occurrences are published by hand exactly as the publisher does it: the run row is claimed in
the store, the message goes out with the deterministic task id and the voltro headers, then the
row is marked published. Each test then polls the row (with a deadline) until the worker moved
it, and checks the status, the timestamps and, through counters the task bodies keep in Redis,
how many times the body really ran. Tasks run in workers started from ``ledger_app.py``.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

import voltro_beat
from voltro_beat import ledger as machine
from voltro_beat import signals as ledger_signals
from voltro_beat.coordination import Coordination
from voltro_beat.ledger import Event, RunState
from voltro_beat.occurrences import Occurrence, task_id_for
from voltro_beat.runs import Run
from voltro_beat.status import ON_WORKER, Reason, Status
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database
from voltro_beat.store.run_writer import RunWriter
from voltro_beat.store.tables import runs

if TYPE_CHECKING:
    from conftest import Worker

StartWorker = Callable[..., "Worker"]

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

HERE = Path(__file__).resolve().parent
#: This run's suffix: queues and schedule names never meet an earlier (aborted) run's messages.
RUN = uuid.uuid4().hex[:8]
SCHEDULED_AT = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=10)
#: The workers' start claim: a redelivery whose first execution died runs within it.
WORKER_LEASE = timedelta(seconds=3)
WAIT = 30.0


def now() -> datetime:
    return datetime.now(UTC)


def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Published:
    key: str
    schedule: str
    task: str
    task_id: str
    args: tuple[Any, ...]

    @property
    def token(self) -> str:
        return self.schedule


@dataclass
class Ledger:
    """What a test needs: publish occurrences, read run rows and the bodies' counters."""

    store: BeatStore
    client: Celery
    redis: redis.Redis
    broker_url: str
    postgres_url: str

    def publish(
        self,
        name: str,
        task: str,
        *,
        queue: str,
        args: tuple[Any, ...] | None = None,
        headers: bool = True,
        **options: Any,
    ) -> Published:
        schedule = f"{name}-{RUN}"
        key = f"{schedule}@{SCHEDULED_AT:%Y-%m-%dT%H:%M:%S}"
        published = Published(
            key, schedule, task, task_id_for(key), (schedule,) if args is None else args
        )
        run = Run(Occurrence(schedule, SCHEDULED_AT, key, published.task_id), task)
        won = self.store.claim([run], coordination=Coordination.ADVISORY_LOCK, lease=LEASE)
        assert won == {key}
        self.send(published, queue=queue, headers=headers, **options)
        self.store.mark_published([key])
        self.store.settle([key])
        return published

    def send(self, p: Published, *, queue: str, headers: bool = True, **options: Any) -> None:
        """Send ``p``'s message (again): same task id, same headers."""
        extra = {"voltro_occurrence": p.key, "periodic_task_name": p.schedule} if headers else {}
        self.client.send_task(
            p.task, p.args, task_id=p.task_id, headers=extra, queue=queue, **options
        )

    def row(self, key: str) -> dict[str, Any]:
        with self.store.database.engine.connect() as conn:
            found = conn.execute(sa.select(runs).where(runs.c.id == key)).mappings().one()
        return dict(found)

    def wait_status(self, p: Published, status: str, timeout: float = WAIT) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            row = self.row(p.key)
            return row if row["status"] == status else None

        try:
            return dict(wait_for(f"{p.key} to be {status}", probe, timeout))
        except pytest.fail.Exception:
            pytest.fail(f"{p.key} is not {status}: {self.row(p.key)}")

    def runs(self, p: Published) -> int:
        """How many times the task body ran for ``p``."""
        return int(self.redis.get(f"ledger:{p.token}:runs") or 0)

    def pid(self, p: Published) -> int | None:
        value = self.redis.get(f"ledger:{p.token}:pid")
        return None if value is None else int(value)

    def states(self, p: Published) -> list[str]:
        """Celery's final state of each delivery of ``p`` (from task_postrun)."""
        return [s.decode() for s in self.redis.lrange(f"ledger:{p.task_id}:states", 0, -1)]

    def worker_env(self, **extra: str) -> dict[str, str]:
        return {
            "LEDGER_BROKER": self.broker_url,
            "VOLTRO_BEAT_STORE_URL": self.postgres_url,
            "VOLTRO_BEAT_WORKER_LEASE": str(WORKER_LEASE.total_seconds()),
            **extra,
        }


@dataclass(frozen=True)
class Lane:
    """A worker and the queue only it consumes."""

    worker: Worker
    queue: str


@pytest.fixture(scope="module")
def ledger(postgres_url: str, redis_url: str) -> Iterator[Ledger]:
    broker_url = f"{redis_url}/5"
    store = BeatStore(Database.open(postgres_url), replica="test-beat")
    store.database.upgrade()
    client = Celery("ledger-client", broker=broker_url, set_as_current=False)
    client.conf.broker_connection_retry_on_startup = True
    rds = redis.Redis.from_url(broker_url)
    yield Ledger(store, client, rds, broker_url, postgres_url)
    client.close()
    # This run's counters, state trails, queues and kombu bindings (all named after RUN or
    # after a task id of one of its occurrences).
    with store.database.engine.connect() as conn:
        keys = conn.execute(sa.select(runs.c.id).where(runs.c.id.contains(RUN))).scalars()
        trails = [f"ledger:{task_id_for(key)}:states" for key in keys]
    leftovers = [*trails, *rds.scan_iter(f"*{RUN}*")]
    if leftovers:
        rds.delete(*leftovers)
    rds.close()
    store.close()


def start_lane(
    ledger: Ledger,
    celery_worker: StartWorker,
    name: str,
    *,
    queue: str | None = None,
    concurrency: int = 2,
    **env: str,
) -> Lane:
    """Start a worker of ``ledger_app`` consuming ``queue`` (default: a queue of its own)."""
    queue = queue or f"ledger-{name}-{RUN}"
    worker = celery_worker(
        "ledger_app",
        app_dir=HERE,
        name=f"{name}-{RUN}",
        args=("-P", "prefork", "-c", str(concurrency), "-Q", queue),
        env=ledger.worker_env(**env),
    )
    return Lane(worker, queue)


@pytest.fixture(scope="module")
def lane(ledger: Ledger, celery_worker: StartWorker) -> Lane:
    """The shared worker most tests use (prefork, two children); stopped after the module."""
    return start_lane(ledger, celery_worker, "main")


def assert_ran(row: dict[str, Any], lane: Lane) -> None:
    """Timestamps in order, a duration that matches them, the worker that ran it."""
    assert row["claimed_at"] <= row["published_at"]
    assert row["claimed_at"] <= row["started_at"] <= row["finished_at"]
    assert row["duration"] == pytest.approx(
        (row["finished_at"] - row["started_at"]).total_seconds(), abs=1e-3
    )
    assert row["worker"].startswith(f"{lane.worker.name}@")
    # hostname:pid of the pool child (not the main process) for rows written by the child.
    assert int(row["worker"].rsplit(":", 1)[1]) != lane.worker.pid


# -- outcomes ----------------------------------------------------------------------------------


def test_success(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("success", "ledger.ok", queue=lane.queue)
    row = ledger.wait_status(p, "succeeded")
    assert_ran(row, lane)
    assert (row["retries"], row["error"], row["reason"]) == (0, None, None)
    assert row["task_id"] == p.task_id
    assert ledger.runs(p) == 1


def test_exception(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("exception", "ledger.boom", queue=lane.queue)
    row = ledger.wait_status(p, "failed")
    assert_ran(row, lane)
    # The error line, then the task's traceback down to where it raised.
    line, blank, *trace = row["error"].splitlines()
    assert (line, blank, trace[0]) == (
        f"ValueError: boom {p.token}",
        "",
        "Traceback (most recent call last):",
    )
    assert 'ledger_app.py", line' in row["error"] and "in boom" in row["error"]
    assert trace[-1] == line
    assert ledger.runs(p) == 1


def test_retry_then_success(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("retry", "ledger.flaky", queue=lane.queue, args=(f"retry-{RUN}", 2))
    row = ledger.wait_status(p, "succeeded")
    assert_ran(row, lane)
    assert row["retries"] == 2
    assert row["reason"] == f"Retry in 0s: ConnectionError('flaky {p.token}')"
    assert row["error"] is None
    assert ledger.runs(p) == 3


def test_revoke_before_start(ledger: Ledger, lane: Lane) -> None:
    name = f"revoke-{RUN}"
    key = f"{name}@{SCHEDULED_AT:%Y-%m-%dT%H:%M:%S}"
    # The worker must hold the revoke before the message arrives: wait for its reply.
    replies = ledger.client.control.revoke(
        task_id_for(key), reply=True, timeout=10, destination=[f"{lane.worker.name}@{_host()}"]
    )
    assert replies, "the worker did not acknowledge the revoke"
    p = ledger.publish("revoke", "ledger.ok", queue=lane.queue)
    row = ledger.wait_status(p, "revoked")
    assert row["reason"] == "revoked"
    assert row["started_at"] is None and row["duration"] is None
    assert row["claimed_at"] <= row["finished_at"]
    assert ledger.runs(p) == 0


def test_hard_time_limit(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("time-limit", "ledger.hang", queue=lane.queue)
    row = ledger.wait_status(p, "failed")
    assert_ran(row, lane)
    assert row["error"] == "TimeLimitExceeded: hard time limit (1s) exceeded"
    assert ledger.runs(p) == 1


def test_worker_lost(ledger: Ledger, lane: Lane) -> None:
    """The pool child running the task is SIGKILLed: Celery acks it as WorkerLostError."""
    p = ledger.publish("worker-lost", "ledger.hold", queue=lane.queue)
    ledger.wait_status(p, "started")
    os.kill(wait_for("the child's pid", lambda: ledger.pid(p)), signal.SIGKILL)
    row = ledger.wait_status(p, "failed")
    assert_ran(row, lane)
    assert row["error"].startswith("WorkerLostError: Worker exited prematurely: signal 9")
    assert ledger.runs(p) == 1


def test_worker_lost_requeued_then_success(ledger: Ledger, lane: Lane) -> None:
    """With reject_on_worker_lost Celery requeues instead: no failure, the rerun succeeds."""
    p = ledger.publish("lost-requeue", "ledger.hold_requeue", queue=lane.queue)
    first = ledger.wait_status(p, "started")
    os.kill(wait_for("the child's pid", lambda: ledger.pid(p)), signal.SIGKILL)
    row = ledger.wait_status(p, "succeeded")
    assert_ran(row, lane)
    assert row["started_at"] > first["started_at"]
    assert row["error"] is None
    assert ledger.runs(p) == 2


def test_worker_killed_mid_task_redelivered_then_success(
    ledger: Ledger, celery_worker: StartWorker
) -> None:
    """kill -9 of the whole worker with acks_late: another worker gets the message again."""
    crashing = start_lane(ledger, celery_worker, "crash-a", LEDGER_VISIBILITY_TIMEOUT="3")
    p = ledger.publish("killed", "ledger.hold", queue=crashing.queue)
    first = ledger.wait_status(p, "started")
    assert first["worker"].startswith(f"{crashing.worker.name}@")
    # "started" is written just before the body: kill once the body is running.
    wait_for("the body to start", lambda: ledger.pid(p))
    crashing.worker.kill()

    # Redis hands the unacknowledged message out again after the visibility timeout.
    rescuer = start_lane(
        ledger,
        celery_worker,
        "crash-b",
        queue=crashing.queue,
        concurrency=1,
        LEDGER_VISIBILITY_TIMEOUT="3",
    )
    row = ledger.wait_status(p, "succeeded")
    assert_ran(row, rescuer)
    assert row["started_at"] > first["started_at"]
    assert row["retries"] == 0
    assert ledger.runs(p) == 2


def test_a_run_recorded_missed_that_then_executed_says_it_ran(ledger: Ledger, lane: Lane) -> None:
    """Reasoning item of issue 18: a run sent but left unmarked (a kill, a failed mark) whose
    deadline passed before its lease is recorded missed by recovery; its message still reaches
    a worker, and the ledger must say what happened: it ran."""
    schedule = f"missed-then-ran-{RUN}"
    key = f"{schedule}@{SCHEDULED_AT:%Y-%m-%dT%H:%M:%S}"
    p = Published(key, schedule, "ledger.ok", task_id_for(key), (schedule,))
    run = Run(Occurrence(schedule, SCHEDULED_AT, key, p.task_id), p.task)
    assert ledger.store.claim([run], coordination=Coordination.ADVISORY_LOCK, lease=LEASE) == {key}
    ledger.store.mark_missed([key], reason=Reason.LATE, waiting=Status.CLAIMED)
    assert ledger.row(key)["status"] == "missed"
    ledger.send(p, queue=lane.queue)
    row = ledger.wait_status(p, "succeeded")
    assert row["started_at"] <= row["finished_at"]
    assert ledger.runs(p) == 1


def test_unknown_task(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("unknown", "ledger.no_such_task", queue=lane.queue)
    row = ledger.wait_status(p, "failed")
    assert row["error"] == "NotRegistered: 'ledger.no_such_task'"
    assert row["started_at"] is None and row["duration"] is None
    assert row["claimed_at"] <= row["finished_at"]
    # Written by the worker's main process, which consumed and dropped the message.
    assert row["worker"] == f"{lane.worker.name}@{_host()}:{lane.worker.pid}"


def test_reject(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("reject", "ledger.reject", queue=lane.queue)
    row = ledger.wait_status(p, "rejected")
    assert_ran(row, lane)
    assert row["error"] == f"Reject: not for me {p.token}"
    assert ledger.runs(p) == 1


def test_tasks_not_published_by_voltro_beat_are_untouched(ledger: Ledger, lane: Lane) -> None:
    """No header, no write: even a message that reuses an occurrence's task id."""
    p = ledger.publish("plain", "ledger.boom", queue=lane.queue, headers=False)
    before = ledger.row(p.key)
    wait_for("the plain task to fail", lambda: ledger.states(p) == ["FAILURE"])
    assert ledger.runs(p) == 1
    assert ledger.row(p.key) == before
    assert before["status"] == "published"


# -- the duplicate delivery guard ---------------------------------------------------------------


def test_duplicate_delivery_does_not_run_the_body_again(ledger: Ledger, lane: Lane) -> None:
    p = ledger.publish("duplicate", "ledger.noisy", queue=lane.queue)
    done = ledger.wait_status(p, "succeeded")
    ledger.send(p, queue=lane.queue)  # the same occurrence, delivered a second time
    wait_for("the second delivery", lambda: len(ledger.states(p)) == 2)
    assert ledger.states(p) == ["SUCCESS", "IGNORED"]
    assert ledger.runs(p) == 1
    # The task's own before_start ran for the real delivery only.
    assert int(ledger.redis.get(f"ledger:{p.token}:before_start") or 0) == 1
    assert ledger.row(p.key) == {**done, "duplicates": 1}


def test_a_duplicate_delivery_after_a_failure_does_not_run_the_body_again(
    ledger: Ledger, lane: Lane
) -> None:
    """Found by the simulation (tests/sim, seed 16): a second message of an occurrence whose
    body had failed ran the body again, and the row kept saying ``failed`` whatever the rerun
    did. A failed run ended like a succeeded one: the duplicate is skipped. Fails without it:
    states == ["FAILURE", "FAILURE"], runs == 2."""
    p = ledger.publish("failed-duplicate", "ledger.boom", queue=lane.queue)
    done = ledger.wait_status(p, "failed")
    ledger.send(p, queue=lane.queue)
    wait_for("the second delivery", lambda: len(ledger.states(p)) == 2)
    assert ledger.states(p) == ["FAILURE", "IGNORED"]
    assert ledger.runs(p) == 1
    assert ledger.row(p.key) == {**done, "duplicates": 1}


def test_a_second_delivery_while_the_first_runs_does_not_run_the_body(
    ledger: Ledger, lane: Lane
) -> None:
    """Issue 18: the guard skipped a delivery only once the first had succeeded; a second
    message that arrived while the first was running ran the body again (chaos scenario 4's
    thousand). Fails without the start claim: runs == 2."""
    p = ledger.publish(
        "while-running", "ledger.slow", queue=lane.queue, args=(f"while-running-{RUN}", 1.5)
    )
    ledger.wait_status(p, "started")
    ledger.send(p, queue=lane.queue)  # taken by the lane's other child while the first runs
    wait_for("both deliveries", lambda: len(ledger.states(p)) == 2)
    assert sorted(ledger.states(p)) == ["IGNORED", "SUCCESS"]
    assert ledger.runs(p) == 1
    row = ledger.row(p.key)
    assert (row["status"], row["duplicates"]) == ("succeeded", 1)


def test_a_live_first_execution_longer_than_the_lease_keeps_its_claim(
    ledger: Ledger, lane: Lane
) -> None:
    """The first execution renews its lease: after a whole lease of waiting, the second
    delivery gives up (skips) while the first is still running."""
    seconds = 3 * WORKER_LEASE.total_seconds()
    p = ledger.publish(
        "long-running", "ledger.slow", queue=lane.queue, args=(f"long-running-{RUN}", seconds)
    )
    ledger.wait_status(p, "started")
    ledger.send(p, queue=lane.queue)
    wait_for("the second delivery to give up", lambda: ledger.states(p) == ["IGNORED"])
    assert ledger.row(p.key)["status"] == "started"
    ledger.wait_status(p, "succeeded", timeout=WAIT + seconds)
    assert ledger.states(p) == ["IGNORED", "SUCCESS"]
    assert ledger.runs(p) == 1


def test_duplicate_guard_can_be_turned_off(ledger: Ledger, celery_worker: StartWorker) -> None:
    off = start_lane(ledger, celery_worker, "guard-off", VOLTRO_BEAT_DUPLICATE_GUARD="false")
    p = ledger.publish("guard-off", "ledger.noisy", queue=off.queue)
    ledger.wait_status(p, "succeeded")
    ledger.send(p, queue=off.queue)
    wait_for("the second delivery", lambda: len(ledger.states(p)) == 2)
    assert ledger.states(p) == ["SUCCESS", "SUCCESS"]
    assert ledger.runs(p) == 2


# -- a ledger that cannot write ---------------------------------------------------------------


def test_a_failing_ledger_never_breaks_the_task(ledger: Ledger, celery_worker: StartWorker) -> None:
    missing = sa.make_url(ledger.postgres_url).set(database=f"vt_missing_{RUN}")
    broken = start_lane(
        ledger,
        celery_worker,
        "broken-store",
        VOLTRO_BEAT_STORE_URL=missing.render_as_string(hide_password=False),
    )
    ok = ledger.publish("broken-ok", "ledger.ok", queue=broken.queue)
    boom = ledger.publish("broken-boom", "ledger.boom", queue=broken.queue)
    wait_for("both tasks to finish", lambda: ledger.states(ok) and ledger.states(boom))
    assert (ledger.states(ok), ledger.states(boom)) == (["SUCCESS"], ["FAILURE"])
    assert (ledger.runs(ok), ledger.runs(boom)) == (1, 1)
    assert "voltro_beat ledger: could not record started" in broken.worker.output()
    assert ledger.row(ok.key)["status"] == "published"


# -- the store applies exactly the pure machine ---------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def contract_writer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunWriter]:
    """A run writer on a SQLite file, and on the module's PostgreSQL database (asked for only
    in that case: the SQLite one runs whether PostgreSQL is up or not)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url")
    writer = RunWriter(Database.open(url))
    writer.database.upgrade()
    yield writer
    writer.close()


def test_advance_is_the_state_machine(contract_writer: RunWriter) -> None:
    """Every event on a row in every status and attempt: the UPDATE does what ``apply`` says."""
    writer = contract_writer
    at = now()
    cases = []
    for n, (event, status, retries, attempt, held) in enumerate(
        itertools.product(Event, Status, range(3), range(3), (False, True))
    ):
        key = f"contract-{RUN}-{n}@{SCHEDULED_AT:%Y-%m-%dT%H:%M:%S}"
        cases.append((key, event, RunState(status, retries, held), attempt))
    started_at = at - timedelta(seconds=2)
    with writer.database.engine.begin() as conn:
        conn.execute(
            runs.insert(),
            [
                {
                    "id": key,
                    "schedule": "contract",
                    "task": "t",
                    "task_id": task_id_for(key),
                    "scheduled_at": SCHEDULED_AT,
                    "coordination_outcome": "won_lock",
                    "status": state.status,
                    "retries": state.retries,
                    "started_at": started_at if state.status in ON_WORKER else None,
                    "worker": "first:1" if state.status in ON_WORKER else None,
                    # A live start claim, or one that lapsed a minute ago.
                    "worker_lease_until": at + timedelta(minutes=1 if state.held else -1),
                }
                for key, _, state, _ in cases
            ],
        )
    moved: dict[str, bool] = {}
    for n, (key, event, _, attempt) in enumerate(cases):
        move = machine.transition(event)
        # Terminal events alternate between the two lookups the worker uses.
        by_task_id = move.stamp == "finish" and n % 2 == 1
        moved[key] = writer.advance(
            move,
            now=at,
            key=None if by_task_id else key,
            task_id=task_id_for(key) if by_task_id else None,
            attempt=attempt,
            worker="second:2",
            reason="why" if move.stamp == "retry" else None,
            error="Boom: x" if move.status == "failed" else None,
            lease=timedelta(minutes=10),
        )
    with writer.database.engine.connect() as conn:
        rows = {r["id"]: dict(r) for r in conn.execute(sa.select(runs)).mappings()}
    for key, event, before, attempt in cases:
        row, move = rows[key], machine.transition(event)
        expected = machine.apply(before, event, attempt)
        case = (event, before, attempt, row)
        assert moved[key] is (expected is not before), case
        assert (row["status"], row["retries"]) == (expected.status, expected.retries), case
        if not moved[key]:
            continue
        if move.stamp == "start":
            assert (row["started_at"], row["worker"]) == (at, "second:2"), case
            # Held for the lease, on the database's clock.
            assert row["worker_lease_until"] > at + timedelta(minutes=9), case
        elif move.stamp == "retry":
            assert row["reason"] == "why", case
        else:
            assert row["finished_at"] == at, case
            assert row["error"] == ("Boom: x" if move.status == "failed" else None), case
            if before.status in ON_WORKER:
                # The start is kept (and its worker): the duration runs from it.
                assert row["worker"] == "first:1", case
                assert row["duration"] == pytest.approx(2.0, abs=1e-3), case
            else:
                assert row["worker"] == "second:2", case
                assert row["started_at"] is None and row["duration"] is None, case
    assert writer.state(cases[0][0]) is not None
    assert writer.state("no-such-run@2026-01-01T00:00:00") is None


def test_ledger_connection_killed_by_the_server_is_replaced(postgres_url: str) -> None:
    store = BeatStore(Database.open(postgres_url), replica="contract")
    store.database.upgrade()
    writer = RunWriter(Database.open(postgres_url))
    key = f"reconnect-{RUN}@{SCHEDULED_AT:%Y-%m-%dT%H:%M:%S}"
    store.claim(
        [Run(Occurrence("reconnect", SCHEDULED_AT, key, task_id_for(key)), "t")],
        coordination=Coordination.ADVISORY_LOCK,
        lease=LEASE,
    )
    assert writer.state(key) == RunState("claimed")  # opens this thread's ledger connection
    backend = writer._connection().connection.dbapi_connection.info.backend_pid
    with store.database.engine.connect() as admin:
        killed = admin.execute(sa.select(sa.func.pg_terminate_backend(backend))).scalar()
    assert killed is True
    assert writer.advance(machine.transition(Event.STARTED), now=now(), key=key, worker="w:1")
    assert writer.state(key) == RunState("started")  # no lease asked for: not held
    writer.close()
    store.close()


# -- attach() in a plain process -----------------------------------------------------------------


def test_attach_is_idempotent_and_opens_nothing() -> None:
    app = Celery("attach-only", set_as_current=False)
    before = {s: len(s.receivers) for s, _ in ledger_signals._RECEIVERS}
    voltro_beat.attach(app)
    voltro_beat.attach(app)
    recorder = ledger_signals._recorder(app)
    assert recorder is not None and recorder._writer is None and recorder._pid is None
    after = {s: len(s.receivers) for s, _ in ledger_signals._RECEIVERS}
    # Connected once (perhaps already by an earlier test), never twice.
    assert all(after[s] - before[s] in (0, 1) for s in before)
    voltro_beat.attach(Celery("another", set_as_current=False))
    assert {s: len(s.receivers) for s, _ in ledger_signals._RECEIVERS} == after


def _host() -> str:
    import socket

    return socket.gethostname()
