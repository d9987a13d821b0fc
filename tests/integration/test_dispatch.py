"""The dispatcher's fence, write, mark and settle against real stores (SQLite and PostgreSQL,
``url``) and kombu's in-memory broker, on the real clock: what a failed statement, a pause or
Celery's own SIGTERM handler in the middle of a delivery leaves behind (issue 18). And what a
real broker's refusal of some messages leaves: RabbitMQ's nack, a Redis command error.

A fault is injected by wrapping one store or publisher method of a real object (the statement
fails once, the write pauses): the store, its SQL and the broker are the real ones.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from beat_kit import drain
from celery import Celery
from celery.apps.beat import Beat
from kombu import Connection, Queue

from voltro_beat import dispatch
from voltro_beat.clock import Clock
from voltro_beat.coordination import Coordination
from voltro_beat.dispatch import Dispatcher
from voltro_beat.exceptions import StoreError
from voltro_beat.occurrences import Occurrence
from voltro_beat.publisher import Publisher
from voltro_beat.runs import Run
from voltro_beat.schedules import parse_entries
from voltro_beat.store import reads
from voltro_beat.store.beat import BeatStore

LOCK = Coordination.ADVISORY_LOCK
#: Short enough to wait out in a test, long enough for a few statements on a busy machine.
LEASE = timedelta(seconds=2)
NAMES = "abc"


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("dispatch", broker="memory://", set_as_current=False)
    drain(app)
    yield app
    drain(app)


def dispatcher(store: BeatStore, app: Celery, queues: dict[str, str] | None = None) -> Dispatcher:
    """A dispatcher of the schedules :data:`NAMES` (each sent to ``queues[name]`` if given)."""
    entries = parse_entries(
        {
            name: {"task": "proj.work", "schedule": 60.0}
            | ({"options": {"queue": queues[name]}} if queues else {})
            for name in NAMES
        },
        tz="UTC",
        max_lateness=timedelta(hours=1),
    )
    clock = Clock(store.database.clock_mode())
    publisher = Publisher(app, write_timeout=LEASE * 3)
    return Dispatcher(store, publisher, {e.name: e for e in entries}, LEASE, clock)


def claimed_now(store: BeatStore) -> list[Occurrence]:
    """One occurrence of each schedule at the current second, claimed by ``store``."""
    at = datetime.now(UTC).replace(microsecond=0)
    occurrences = [Occurrence.of(n, at) for n in NAMES]
    runs = [Run(o, "proj.work", deadline=at + timedelta(hours=1)) for o in occurrences]
    assert store.claim(runs, coordination=LOCK, lease=LEASE) == {o.key for o in occurrences}
    return occurrences


def row(store: BeatStore, key: str) -> dict[str, Any]:
    (found,) = [r for r in reads.recent_runs(store.database, limit=100) if r["id"] == key]
    return found


def sent_keys(app: Celery) -> list[str]:
    return [h["voltro_occurrence"] for h in drain(app)]


def failing_once(target: object, name: str) -> list[int]:
    """Make ``target.name`` raise a StoreError on its first call (a blip: a reset
    connection, a failover); returns the list its calls are counted in."""
    calls: list[int] = []
    real = getattr(target, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("the connection was reset (injected)")
        return real(*args, **kwargs)

    setattr(target, name, call)
    return calls


def test_a_failed_mark_keeps_the_chunk_written_meanwhile(
    stores: Callable[[str], BeatStore], app: Celery
) -> None:
    """Finding 1: a mark statement that fails once, in a delivery of three chunks, must not
    cost the mark of the chunk written while it ran. Before, that chunk was neither marked
    nor kept for a retry, and another replica's recovery sent it again a lease later."""
    holder, other = stores("holder"), stores("other")
    a, b, c = claimed_now(holder)
    d = dispatcher(holder, app)
    chunks = [d.fence([o]) for o in (a, b, c)]
    failing_once(holder, "mark_published")
    with pytest.raises(StoreError):
        d.deliver(chunks)
    # a's mark failed, b was written meanwhile; the delivery stopped before c.
    assert sent_keys(app) == [a.key, b.key]
    assert sorted(d.unmarked) == sorted([a.key, b.key])
    d.flush()  # the next tick's first step
    assert all(row(holder, o.key)["status"] == "published" for o in (a, b))
    time.sleep(d.hold.total_seconds() + 0.2)  # c's lease runs out
    taken = other.take_over(schedules=set(NAMES), hold=LEASE, limit=10)
    assert [o.key for o in taken] == [c.key]


def test_sigterm_in_the_retry_of_a_failed_mark_keeps_it_for_close(
    stores: Callable[[str], BeatStore], app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by tests/sim (seed 280 of the long run): a mark that failed is retried by the
    next step's flush; Celery's SIGTERM handler raising SystemExit in the middle of that
    statement dropped the runs from the ones waiting for their mark, so close() had nothing
    left to mark and the rows never got their publish time (a worker that had started them
    hid them from recovery). Fails without it: close() marks nothing."""
    holder = stores("holder")
    a, _, _ = claimed_now(holder)
    d = dispatcher(holder, app)
    failing_once(holder, "mark_published")
    with pytest.raises(StoreError):
        d.deliver([d.fence([a])])
    assert d.unmarked == [a.key]
    mark = holder.mark_published

    def signalled(keys: Any) -> Any:
        raise SystemExit()  # Celery's handler, in the middle of the statement

    monkeypatch.setattr(holder, "mark_published", signalled)
    with pytest.raises(SystemExit):
        d.flush()
    monkeypatch.setattr(holder, "mark_published", mark)
    d.close()  # the scheduler's close, once the tick has unwound
    assert row(holder, a.key)["status"] == "published"


def test_a_pause_right_before_the_write_must_outlast_a_whole_lease(
    stores: Callable[[str], BeatStore], app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 2: a chunk is written only while a whole lease of it is left on the
    database's clock, so a pause of the replica between that check and the broker write (a
    SIGSTOP, a VM freeze: nothing runs, no lease is renewed) must last longer than the publish
    timeout before another replica can take the runs over. Before, a chunk fenced less than
    half a lease ago was written as it was: a pause of just over half the timeout was enough."""
    holder, other = stores("holder"), stores("other")
    runs = claimed_now(holder)
    d = dispatcher(holder, app)
    fenced = d.fence(runs)
    time.sleep(LEASE.total_seconds() * 0.45)
    # The process is paused from here until the write reaches the broker: nothing renews.
    monkeypatch.setattr(d.runner, "every", lambda seconds, fn: lambda: None)
    publish = d.publisher.publish
    taken: list[Occurrence] = []

    def paused(messages: Any) -> Any:
        time.sleep(LEASE.total_seconds() * 0.9)
        taken.extend(other.take_over(schedules=set(NAMES), hold=LEASE, limit=10))
        return publish(messages)

    monkeypatch.setattr(d.publisher, "publish", paused)
    assert d.deliver([fenced])
    assert taken == []
    assert sorted(sent_keys(app)) == sorted(o.key for o in runs)


def test_a_chunk_its_fence_found_nothing_of_is_skipped(
    stores: Callable[[str], BeatStore], app: Celery
) -> None:
    """Found by tests/sim (seed 443): a chunk whose fence found none of its runs still this
    replica's (paused past their lease, taken over) was fenced again at its instant, with no
    runs: ``max()`` of nothing raised, the step failed before its heartbeat (a booting replica
    then took this one for dead and applied its catch-up policy), and the chunks due with it
    waited for recovery. Fails without it: ValueError."""
    holder = stores("holder")
    a, b, c = claimed_now(holder)
    d = dispatcher(holder, app)
    holder.mark_published([a.key])  # no longer this replica's to send
    gone = d.fence([a])
    assert gone.occurrences == []
    assert d.deliver([gone, d.fence([b, c])])
    assert sorted(sent_keys(app)) == sorted([b.key, c.key])


def test_sigterm_in_the_middle_of_a_write_waits_for_its_mark(
    stores: Callable[[str], BeatStore], app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 4: Celery's beat stops on SIGTERM by running the scheduler's close() and then
    raising SystemExit from its signal handler, wherever the tick is. In the middle of a
    broker write that unwound the write before its mark: the broker had the chunk, nothing
    recorded it, and another replica sent it again. The signal now waits until the chunk's
    mark is under way; the chunks after it are not written."""
    holder = stores("holder")
    a, b, c = claimed_now(holder)
    d = dispatcher(holder, app)
    chunks = [d.fence([o]) for o in (a, b, c)]
    publish = d.publisher.publish

    def signalled(messages: Any) -> Any:
        refused = publish(messages)
        signal.raise_signal(signal.SIGTERM)  # the kernel delivers it during the write
        return refused

    monkeypatch.setattr(d.publisher, "publish", signalled)
    previous = signal.getsignal(signal.SIGTERM)
    # Celery's own handler: the beat service's sync() (here: the dispatcher's part of the
    # scheduler's close()), then SystemExit.
    Beat(app=app).install_sync_handler(SimpleNamespace(sync=d.close))
    try:
        with pytest.raises(SystemExit):
            d.deliver(chunks)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sent_keys(app) == [a.key]
    assert row(holder, a.key)["published_at"] is not None
    assert row(holder, a.key)["status"] == "published"
    assert [row(holder, o.key)["published_at"] for o in (b, c)] == [None, None]


def test_sigterm_while_the_last_mark_runs_waits_until_it_is_done(
    stores: Callable[[str], BeatStore], app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by tests/sim (seed 7146 of the long run): a replica told to stop twice (a
    rolling deploy's SIGTERM during its close, a second Ctrl-C) took the second signal while
    it waited for the mark of the last chunk it had written. Celery's handler (the scheduler
    already closed: it only raises ``SystemExit``) ended the wait there, and the process ended
    while the mark's statement ran on the marker thread: the broker had the chunk, its rows
    never got their publish time. The signal now waits until the mark is done. Fails without
    it: the ``SystemExit`` leaves the delivery before the row is marked."""
    holder = stores("holder")
    a, _, _ = claimed_now(holder)
    d = dispatcher(holder, app)
    fenced = d.fence([a])
    main = threading.main_thread().ident
    assert main is not None
    waiting = threading.Event()
    wait = dispatch._wait

    def waits(marking: Any) -> None:
        if marking is not None:
            waiting.set()  # the main thread waits for the mark from here on
        wait(marking)

    mark = holder.mark_published

    def slow_mark(keys: Any) -> Any:  # on the marker thread
        assert waiting.wait(10)
        signal.pthread_kill(main, signal.SIGTERM)  # the kernel interrupts the main thread
        time.sleep(0.5)  # a slow statement
        return mark(keys)

    monkeypatch.setattr(dispatch, "_wait", waits)
    monkeypatch.setattr(holder, "mark_published", slow_mark)
    previous = signal.getsignal(signal.SIGTERM)
    Beat(app=app).install_sync_handler(SimpleNamespace(sync=lambda: None))
    try:
        with pytest.raises(SystemExit):
            d.deliver([fenced])
            time.sleep(5)  # the signal lands no later than the end of the delivery
        # The process would end here: what the broker took must be marked already.
        assert row(holder, a.key)["published_at"] is not None
    finally:
        signal.signal(signal.SIGTERM, previous)
        d.close()
    assert sent_keys(app) == [a.key]


# -- the broker refuses some messages ---------------------------------------------------------


def queued(broker: str, queue: str) -> list[str]:
    """The occurrence keys of the messages in ``queue`` (taken off it)."""
    keys = []
    with Connection(broker) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(queue=queue, no_ack=True)) is not None:
            keys.append(message.headers["voltro_occurrence"])
    return keys


def test_rabbitmq_refusing_a_message_leaves_it_for_recovery(
    stores: Callable[[str], BeatStore], amqp_url: str
) -> None:
    """Finding 3: a queue at its x-max-length with reject-publish nacks what does not fit.
    Before, the refused run was marked published (in no queue) and the chunk's other runs
    stayed claimed, sent again every lease until max_lateness. Now each delivery tag counts:
    the taken runs are marked, the refused one is not, its lease ends at once with the
    broker's answer noted, and recovery sends it (only it) again."""
    name = f"vbt-refuse-{time.monotonic_ns()}"
    app = Celery("refuse", broker=amqp_url, set_as_current=False)
    full = {"x-max-length": 2, "x-overflow": "reject-publish", "x-expires": 60_000}
    app.conf.task_queues = [Queue(name, routing_key=name, queue_arguments=full)]
    holder, other = stores("holder"), stores("other")
    a, b, c = claimed_now(holder)
    d = dispatcher(holder, app, queues=dict.fromkeys(NAMES, name))
    assert d.deliver([d.fence([a, b, c])])  # the broker answered for all three
    assert sorted(queued(amqp_url, name)) == sorted([a.key, b.key])
    assert [row(holder, o.key)["status"] for o in (a, b)] == ["published", "published"]
    refused = row(holder, c.key)
    assert (refused["status"], refused["published_at"]) == ("claimed", None)
    assert "basic.nack" in refused["error"]
    # Its lease ended at once: recovery (any replica) takes it now and sends it again.
    taken = other.take_over(schedules=set(NAMES), hold=LEASE, limit=10)
    assert [o.key for o in taken] == [c.key]
    again = dispatcher(other, app, queues=dict.fromkeys(NAMES, name))
    assert again.send(taken)
    assert queued(amqp_url, name) == [c.key]
    assert (row(other, c.key)["status"], row(other, c.key)["error"]) == ("published", None)


def test_a_redis_command_error_refuses_only_its_messages(
    stores: Callable[[str], BeatStore], redis_url: str
) -> None:
    """Reasoning item: one queue's key holds a string (WRONGTYPE inside EXEC) while the other
    pushes of the transaction ran. Before, nothing of the chunk counted as confirmed and all of
    it went out again every lease; now only that queue's message is refused."""
    broker = f"{redis_url}/11"
    client = redis.Redis.from_url(broker)
    client.flushdb()
    app = Celery("wrongtype", broker=broker, set_as_current=False)
    holder = stores("holder")
    a, b, c = claimed_now(holder)
    d = dispatcher(holder, app, queues={"a": "fine", "b": "fine", "c": "broken"})
    d.publisher.prepare(list(d.entries.values()))  # queues declared, payloads captured
    client.set("broken", "not a list")  # then someone's code overwrites one queue's key
    assert d.deliver([d.fence([a, b, c])])
    assert client.llen("fine") == 2
    assert [row(holder, o.key)["status"] for o in (a, b)] == ["published", "published"]
    refused = row(holder, c.key)
    assert (refused["status"], refused["published_at"]) == ("claimed", None)
    assert "WRONGTYPE" in refused["error"]
    client.flushdb()


def test_a_run_refused_until_its_deadline_is_missed_with_the_reason(
    stores: Callable[[str], BeatStore],
) -> None:
    holder = stores("holder")
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    run = Occurrence.of("a", at)
    claim = Run(run, "proj.work", deadline=at + timedelta(seconds=5.5))
    assert holder.claim([claim], coordination=LOCK, lease=LEASE) == {run.key}
    holder.refuse([run.key], reason="refused by the broker (basic.nack)")
    time.sleep(0.6)  # past the deadline
    (missed,) = holder.expire(known=set(NAMES), limit=10)
    assert (missed.occurrence.key, missed.reason) == (run.key, "broker_refused")
    assert row(holder, run.key)["error"] == "refused by the broker (basic.nack)"
