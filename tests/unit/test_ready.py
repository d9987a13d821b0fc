"""The queue of occurrences won ahead (voltro_beat.engine.ready): when it fences and when it
writes, at fixed instants, with a dispatcher that only says what was asked of it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from voltro_beat.dispatch import Fenced
from voltro_beat.engine.ready import Ready
from voltro_beat.engine.timeline import Timeline
from voltro_beat.occurrences import Occurrence

T0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
LEASE = timedelta(seconds=10)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t

    def monotonic(self) -> float:
        return (self.t - T0).total_seconds()


class Dispatcher:
    """One occurrence a chunk; every fence takes ``fence_takes`` of the clock's time."""

    chunk = 1

    def __init__(self, clock: Clock, fence_takes: timedelta) -> None:
        self.clock = clock
        self.fence_takes = fence_takes
        self.calls: list[str] = []

    def fence(self, occurrences: Sequence[Occurrence]) -> Fenced:
        self.clock.t += self.fence_takes
        self.calls += [f"fence {o.schedule}" for o in occurrences]
        return Fenced(list(occurrences), occurrences[0].scheduled_at, self.clock.t + LEASE, None)

    def until(self, fenced: Fenced) -> timedelta:
        return fenced.instant - self.clock.t

    def deliver(self, chunks: Sequence[Fenced], *, settle: bool = True) -> bool:
        self.calls += [f"write {o.schedule}" for c in chunks for o in c.occurrences]
        return True

    def settle(self) -> None:
        """Noted when something was written since the last settle."""
        written = [c for c in self.calls if c.startswith("write") or c == "settle"]
        if written and written[-1] != "settle":
            self.calls.append("settle")


def ready(fence_takes: float, ahead: int = 10_000) -> tuple[Ready, Dispatcher, Clock]:
    clock = Clock(T0 - timedelta(seconds=1))
    dispatch = Dispatcher(clock, timedelta(seconds=fence_takes))
    timeline = Timeline(LEASE, (), lambda name: False, lambda name: True)
    timeline.lead_for(ahead)  # 10,000: a claim lead of 3.25 s, fenced 1.625 s ahead
    queue = Ready(dispatch, clock, timeline)  # type: ignore[arg-type]
    for name in "abcd":
        queue.push(Occurrence(name, T0, f"{name}@0", f"id-{name}"))
    return queue, dispatch, clock


def steps(queue: Ready, clock: Clock) -> None:
    """The engine's steps, back to back while the queue has something due."""
    queue.publish()
    while queue.next_publish() <= clock.t:
        queue.publish()


def test_a_burst_fenced_ahead_is_written_at_its_instant() -> None:
    queue, dispatch, clock = ready(fence_takes=0.1)
    queue.publish()
    assert dispatch.calls == ["fence a", "fence b", "fence c", "fence d"]
    clock.t = T0
    queue.publish()
    assert dispatch.calls[4:] == ["write a", "write b", "write c", "write d", "settle"]


def test_a_burst_claimed_30_s_ahead_is_fenced_15_s_ahead() -> None:
    # At 100,000 schedules the claim lead is 30 s. Capped at a quarter lease (2.5 s ahead),
    # the fences of such a burst ran on past its boundary, between its writes.
    queue, dispatch, clock = ready(fence_takes=0.1, ahead=100_000)
    clock.t = T0 - timedelta(seconds=15)
    queue.publish()
    assert dispatch.calls == ["fence a", "fence b", "fence c", "fence d"]
    # Fenced, not written: what the replica's next claims are leased longer by. Counted only
    # before their fence, a cold replica's claims after the fences of the first 10,000 were
    # leased as if nothing came before them, and 30,000 ran out before their writes.
    assert queue.waiting == 4


def test_fencing_stops_once_the_first_fenced_chunk_is_due() -> None:
    # Fences slower than the time left before the instant (a loaded host, a burst of 100
    # chunks): what is fenced is written as soon as its instant comes, the rest fenced and
    # written after it, instead of every fence first while the first leases run out.
    queue, dispatch, clock = ready(fence_takes=0.6)
    steps(queue, clock)
    assert dispatch.calls == [
        *["fence a", "fence b"],
        *["write a", "write b"],
        *["fence c", "write c", "fence d", "write d"],
    ]


def test_a_publish_goes_on_for_a_slice_and_leaves_the_rest_to_the_next_step() -> None:
    # A replica's third of a million occurrences published in one step held the step past
    # the shards' leases, which only the heartbeat renews (between steps): they moved. The
    # settle waits for the end of the burst (one between two slices held its last message).
    queue, dispatch, clock = ready(fence_takes=0.4)
    clock.t = T0
    queue.publish()
    assert dispatch.calls == ["fence a", "write a", "fence b", "write b", "fence c", "write c"]
    assert queue.next_publish() <= clock.t
    queue.publish()
    assert dispatch.calls[6:] == ["fence d", "write d", "settle"]
