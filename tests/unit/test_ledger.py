"""The run ledger's state machine (voltro_beat.ledger): every pair of events, random orders."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voltro_beat import ledger
from voltro_beat import status as statuses
from voltro_beat.ledger import Event, RunState, apply, progress, transition
from voltro_beat.status import Status

PUBLISHED = RunState("published")
TERMINAL_EVENTS = [
    Event.SUCCEEDED,
    Event.FAILED,
    Event.REVOKED,
    Event.REJECTED,
    Event.WORKER_LOST,
    Event.TIME_LIMIT,
    Event.UNKNOWN_TASK,
]
EXPECTED_STATUS = {
    Event.STARTED: "started",
    Event.RETRYING: "retrying",
    Event.SUCCEEDED: "succeeded",
    Event.FAILED: "failed",
    Event.REVOKED: "revoked",
    Event.REJECTED: "rejected",
    Event.WORKER_LOST: "failed",
    Event.TIME_LIMIT: "failed",
    Event.UNKNOWN_TASK: "failed",
}


def run(events: list[tuple[Event, int]], state: RunState = PUBLISHED) -> RunState:
    for event, attempt in events:
        state = apply(state, event, attempt)
    return state


def test_every_event_maps_to_a_known_status() -> None:
    assert set(Event) == set(EXPECTED_STATUS)
    for event, status in EXPECTED_STATUS.items():
        assert transition(event).status == status
        assert status in set(Status)
    assert statuses.TERMINAL | statuses.IN_FLIGHT | {Status.QUEUED} == set(Status)
    assert not statuses.TERMINAL & statuses.IN_FLIGHT


def test_transitions_accept_event_values() -> None:
    assert transition("worker_lost") is transition(Event.WORKER_LOST)
    with pytest.raises(ValueError):
        transition("exploded")


@pytest.mark.parametrize(("first", "second"), list(itertools.product(Event, Event)))
def test_every_pair_of_events(first: Event, second: Event) -> None:
    """Two events of the same attempt, in this order, on a published run."""
    final = run([(first, 0), (second, 0)])
    if first in TERMINAL_EVENTS:
        # Terminal states win: nothing after them counts, a duplicate included.
        assert final == RunState(EXPECTED_STATUS[first])
    elif second in TERMINAL_EVENTS:
        assert final.status == EXPECTED_STATUS[second]
    elif (first, second) == (Event.STARTED, Event.STARTED):
        # A second start of the same attempt while the first holds the row: nothing moves.
        assert final == RunState("started", 0, held=True)
    else:
        # After a retry of attempt 0 the row is at attempt 1: attempt 0's events are stale.
        assert final == RunState("retrying", 1)


@pytest.mark.parametrize("event", list(Event))
@pytest.mark.parametrize("status", ["queued", "missed", "skipped"])
def test_worker_events_leave_beat_only_rows_alone(event: Event, status: str) -> None:
    if (status, event) == ("missed", Event.STARTED):
        # Recorded missed, yet a worker got its message: the ledger says it ran.
        assert apply(RunState(status), event, 0) == RunState("started", 0, held=True)
    else:
        assert apply(RunState(status), event, 0) == RunState(status)


def test_a_redelivery_starts_again_once_the_first_lease_lapsed() -> None:
    """acks_late after a worker crash, or a second message: the same attempt starts again
    only once the first start's worker lease has lapsed (its execution died)."""
    live = RunState("started", 0, held=True)
    assert apply(live, Event.STARTED, 0) is live
    lapsed = RunState("started", 0, held=False)
    assert apply(lapsed, Event.STARTED, 0) == RunState("started", 0, held=True)
    # Celery's own retry of the occurrence (a later attempt) never waits.
    assert apply(live, Event.STARTED, 1) == RunState("started", 1, held=True)


@pytest.mark.parametrize(
    ("state", "attempt", "verdict"),
    [
        (None, 0, ledger.Verdict.RUN),
        (RunState("succeeded"), 0, ledger.Verdict.SKIP),
        (RunState("retrying", 2), 1, ledger.Verdict.SKIP),
        (RunState("started", 2, held=True), 1, ledger.Verdict.SKIP),
        (RunState("started", 1, held=True), 1, ledger.Verdict.WAIT),
        (RunState("claimed"), 0, ledger.Verdict.WAIT),
        (RunState("missed"), 0, ledger.Verdict.WAIT),
        (RunState("failed"), 0, ledger.Verdict.SKIP),
        (RunState("revoked"), 0, ledger.Verdict.SKIP),
        (RunState("rejected"), 0, ledger.Verdict.SKIP),
        (RunState("skipped"), 0, ledger.Verdict.SKIP),
        (RunState("queued"), 0, ledger.Verdict.RUN),
    ],
)
def test_the_verdict_on_a_second_delivery(
    state: RunState | None, attempt: int, verdict: ledger.Verdict
) -> None:
    assert ledger.second_delivery(state, attempt) is verdict


@pytest.mark.parametrize("event", list(Event))
def test_a_claimed_row_moves_like_a_published_one(event: Event) -> None:
    # The worker can start before beat marked the row published.
    assert apply(RunState("claimed"), event) == apply(PUBLISHED, event)


def test_a_retried_run_cycles_through_its_attempts() -> None:
    history = [
        (Event.STARTED, 0),
        (Event.RETRYING, 0),
        (Event.STARTED, 1),
        (Event.RETRYING, 1),
        (Event.STARTED, 2),
        (Event.SUCCEEDED, 2),
    ]
    states = []
    state = PUBLISHED
    for event, attempt in history:
        state = apply(state, event, attempt)
        states.append(state)
    assert states == [
        RunState("started", 0, held=True),
        RunState("retrying", 1),
        RunState("started", 1, held=True),
        RunState("retrying", 2),
        RunState("started", 2, held=True),
        RunState("succeeded", 2),
    ]


def test_late_events_of_an_older_attempt_change_nothing() -> None:
    # The retried delivery started (attempt 1) before attempt 0's retry signal was written.
    state = run([(Event.STARTED, 0), (Event.STARTED, 1), (Event.RETRYING, 0), (Event.STARTED, 0)])
    assert state == RunState("started", 1, held=True)


def test_hard_time_limit_reported_twice_and_prerun_after_revoke() -> None:
    assert run([(Event.STARTED, 0), (Event.TIME_LIMIT, 0), (Event.TIME_LIMIT, 0)]) == RunState(
        "failed"
    )
    assert run([(Event.REVOKED, 0), (Event.STARTED, 0), (Event.SUCCEEDED, 0)]) == RunState(
        "revoked"
    )


def test_transition_shapes_match_the_reference() -> None:
    """The store builds its WHERE clause from these sets; ``apply`` is their meaning."""
    for event in Event:
        move = transition(event)
        for status, retries, attempt, held in itertools.product(
            Status, range(3), range(3), (False, True)
        ):
            state = RunState(status, retries, held)
            moved = apply(state, event, attempt)
            expected = (
                status in move.from_statuses
                or (status in move.attempt_statuses and retries <= attempt)
                or (
                    status in move.held_statuses
                    and (retries < attempt or (retries == attempt and not held))
                )
            )
            assert move.allows(state, attempt) is expected
            if not expected:
                assert moved is state


# -- random orders -------------------------------------------------------------------------

non_terminal = st.tuples(st.sampled_from([Event.STARTED, Event.RETRYING]), st.integers(0, 4))
any_event = st.tuples(st.sampled_from(list(Event)), st.integers(0, 4))


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[Event, int]], Event | None]:
    """One run's events as Celery could produce them, then delivered in any order.

    Attempts 0..n each start; all but the last retried; the last may end in one terminal
    event, possibly reported twice (the hard time limit's double task_failure) -- or not at
    all (the worker died and the message has not come back yet). Then duplicates are added
    and the whole lot shuffled.
    """
    attempts = draw(st.integers(0, 3))
    events: list[tuple[Event, int]] = []
    for attempt in range(attempts + 1):
        events.append((Event.STARTED, attempt))
        if attempt < attempts:
            events.append((Event.RETRYING, attempt))
    terminal = draw(st.one_of(st.none(), st.sampled_from(TERMINAL_EVENTS)))
    if terminal is not None:
        events.extend([(terminal, attempts)] * draw(st.integers(1, 2)))
    events.extend(draw(st.lists(st.sampled_from(events), max_size=4)))
    return draw(st.permutations(events)), terminal


@given(histories())
def test_any_order_ends_in_the_terminal_events_state(
    history: tuple[list[tuple[Event, int]], Event | None],
) -> None:
    events, terminal = history
    final = run(events)
    if terminal is not None:
        assert final.status == EXPECTED_STATUS[terminal]
    else:
        # No end yet: the furthest attempt any event reported, whatever the arrival order.
        furthest = max(progress(apply(PUBLISHED, e, a)) for e, a in events)
        assert final.status in statuses.ON_WORKER
        assert progress(final) == furthest


@given(st.lists(any_event, max_size=12), st.sampled_from(["claimed", "published"]))
def test_progress_never_goes_back_and_terminal_states_stick(
    events: list[tuple[Event, int]], start: str
) -> None:
    state = RunState(start)
    first_terminal: Event | None = None
    for event, attempt in events:
        after = apply(state, event, attempt)
        assert progress(after) >= progress(state)
        if state.status in statuses.TERMINAL:
            assert after == state
        if first_terminal is None and event in TERMINAL_EVENTS:
            first_terminal = event
        state = after
    if first_terminal is not None:
        # Every terminal event moves any live row, so the first one decides.
        assert state.status == EXPECTED_STATUS[first_terminal]


@given(st.lists(non_terminal, max_size=12))
def test_non_terminal_events_commute(events: list[tuple[Event, int]]) -> None:
    """The state depends on which events arrived, not on their order."""
    assert run(events) == run(sorted(events, key=lambda e: progress(apply(PUBLISHED, *e))))


# -- texts ---------------------------------------------------------------------------------


def test_describe_error_is_bounded_and_names_the_type() -> None:
    assert ledger.describe_error(ValueError("boom")) == "ValueError: boom"
    assert ledger.describe_error(KeyError()) == "KeyError"
    long = ledger.describe_error(RuntimeError("x" * 5000))
    assert len(long) == ledger.MAX_TEXT and long.startswith("RuntimeError: xxx")
    assert long.endswith("\u2026")


def test_describe_error_survives_a_broken_str() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert ledger.describe_error(Weird()) == "Weird"


def test_describe_error_does_not_repeat_a_self_naming_message() -> None:
    class SelfNaming(Exception):
        def __str__(self) -> str:
            return "SelfNaming(1,)"

    assert ledger.describe_error(SelfNaming()) == "SelfNaming(1,)"


def test_an_error_keeps_the_end_of_its_traceback() -> None:
    assert ledger.with_traceback("ValueError: x", None) == "ValueError: x"
    assert ledger.with_traceback("ValueError: x", "  \n") == "ValueError: x"
    short = "Traceback (most recent call last):\n  ...\nValueError: x\n"
    assert ledger.with_traceback("ValueError: x", short) == f"ValueError: x\n\n{short.rstrip()}"
    deep = "Traceback (most recent call last):\n" + "  frame\n" * 10_000 + "ValueError: x"
    kept = ledger.with_traceback("ValueError: x", deep)
    head, tail = kept.split("\n\n", 1)
    assert head == "ValueError: x" and len(tail) == ledger.MAX_TRACEBACK
    assert tail.startswith("\u2026") and tail.endswith("  frame\nValueError: x")
