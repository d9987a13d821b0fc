"""The run ledger's state machine: which worker event moves a run row to which status.

Pure: no I/O, no clock reads, no SQLAlchemy or Celery. :mod:`voltro_beat.signals` turns Celery
signals into :class:`Event` values and the store applies each :class:`Transition` as ONE
conditional UPDATE (``... WHERE id = :key AND (status IN :from_statuses OR (status IN
:attempt_statuses AND retries <= :attempt))``), so concurrent writers (the pool child, the
worker's main process, another worker holding a redelivered copy) never read-then-write.

The rules:

* **Terminal statuses win.** ``succeeded``, ``failed``, ``revoked`` and ``rejected`` (and the
  beat-side ``missed`` / ``skipped``) are never left: a late or duplicate event changes nothing
  (Celery sends ``task_failure`` twice on a hard time limit; a prerun may arrive after a
  revoke the main process already recorded). One exception: a start moves ``missed``. Beat
  records ``missed`` a run it could not confirm in time, which the broker may have taken all
  the same; a worker that starts it shows it was sent, and the ledger says what happened.
* **Monotonic.** Non-terminal moves never go back: :func:`progress` never decreases. A task
  that retries cycles ``started -> retrying -> started``, so the row's ``retries`` column (the
  attempt number, Celery's ``request.retries``) is part of the state: an event of an older
  attempt than the row's is stale and changes nothing.
* **The start claim.** A start holds the row for its worker for ``voltro_beat_worker_lease``
  (the worker renews it while the body runs). A start of the *same* attempt moves a
  ``started`` row only once that lease has lapsed: it is a redelivery (acks_late after a
  worker crash, a second message) whose earlier execution died; while the lease runs, it is
  a second delivery of a live execution, and the worker does not run its body
  (:func:`second_delivery`).
* Worker events only move rows that were published (``claimed`` or later); ``queued``,
  ``missed`` and ``skipped`` rows belong to beat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from voltro_beat.status import BEFORE_START, IN_FLIGHT, ON_WORKER, TERMINAL, Status

#: Longest ``error`` / ``reason`` text written to a run row (exception messages can be huge).
MAX_TEXT = 1000
#: How much of a failed task's traceback its run row keeps after the error line: the end,
#: where it raised (a deep recursion's traceback runs to megabytes).
MAX_TRACEBACK = 16_000


class Event(StrEnum):
    """What a worker reports about one delivery of an occurrence."""

    STARTED = "started"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REVOKED = "revoked"
    REJECTED = "rejected"
    WORKER_LOST = "worker_lost"
    TIME_LIMIT = "time_limit"
    UNKNOWN_TASK = "unknown_task"


class Stamp(StrEnum):
    """Which columns a transition writes besides ``status`` (``retries`` as
    :meth:`Transition.retries_written` says)."""

    #: ``started_at``, ``worker``.
    START = "start"
    #: ``reason``.
    RETRY = "retry"
    #: ``finished_at``, ``duration``, ``error``, ``reason``; ``started_at`` and ``worker``
    #: only where none was recorded.
    FINISH = "finish"


@dataclass(frozen=True, slots=True)
class Transition:
    """The effect of one :class:`Event`: the status it moves to and the statuses it moves from.

    A row moves to ``status`` if its status is in ``from_statuses``; or in
    ``attempt_statuses`` and its ``retries`` is at most the event's attempt; or in
    ``held_statuses`` and its ``retries`` is below the event's attempt, or equal to it once the
    row's worker lease has lapsed.
    """

    event: Event
    status: Status
    stamp: Stamp
    from_statuses: frozenset[Status]
    attempt_statuses: frozenset[Status] = frozenset()
    held_statuses: frozenset[Status] = frozenset()

    def allows(self, state: RunState, attempt: int = 0) -> bool:
        """Whether a row in ``state`` moves when this event of ``attempt`` arrives."""
        if state.status in self.from_statuses:
            return True
        if state.status in self.attempt_statuses and state.retries <= attempt:
            return True
        return state.status in self.held_statuses and (
            state.retries < attempt or (state.retries == attempt and not state.held)
        )

    def retries_written(self, attempt: int) -> int | None:
        """The ``retries`` this event of ``attempt`` writes (None: the row keeps its own).

        ``retries`` is Celery's attempt number: a start records its attempt, a retry the
        attempt that comes next.
        """
        if self.stamp is Stamp.START:
            return attempt
        if self.stamp is Stamp.RETRY:
            return attempt + 1
        return None

    def retries_after(self, state: RunState, attempt: int) -> int:
        """The row's ``retries`` once this event of ``attempt`` moved it."""
        written = self.retries_written(attempt)
        return state.retries if written is None else written


def _finish(event: Event, status: Status) -> Transition:
    # A terminal event ends the run whatever attempt reported it: Celery sends no terminal
    # event for an attempt it then runs again (a requeue is silent), so there is no stale one.
    return Transition(event, status, Stamp.FINISH, IN_FLIGHT)


#: Every event's transition.
TRANSITIONS: Mapping[Event, Transition] = {
    Event.STARTED: Transition(
        Event.STARTED,
        Status.STARTED,
        Stamp.START,
        BEFORE_START | {Status.MISSED},
        frozenset({Status.RETRYING}),
        frozenset({Status.STARTED}),
    ),
    Event.RETRYING: Transition(
        Event.RETRYING, Status.RETRYING, Stamp.RETRY, BEFORE_START, ON_WORKER
    ),
    Event.SUCCEEDED: _finish(Event.SUCCEEDED, Status.SUCCEEDED),
    Event.FAILED: _finish(Event.FAILED, Status.FAILED),
    Event.REVOKED: _finish(Event.REVOKED, Status.REVOKED),
    Event.REJECTED: _finish(Event.REJECTED, Status.REJECTED),
    # The main-process failure paths are failures like any other; the row's error says which.
    Event.WORKER_LOST: _finish(Event.WORKER_LOST, Status.FAILED),
    Event.TIME_LIMIT: _finish(Event.TIME_LIMIT, Status.FAILED),
    Event.UNKNOWN_TASK: _finish(Event.UNKNOWN_TASK, Status.FAILED),
}


@dataclass(frozen=True, slots=True)
class RunState:
    """The part of a run row the state machine reads: its status, its attempt number, and
    whether a live worker lease holds it (a start claim not lapsed yet)."""

    status: Status
    retries: int = 0
    held: bool = False


def transition(event: Event | str) -> Transition:
    """The transition of ``event`` (an :class:`Event` or its value)."""
    return TRANSITIONS[Event(event)]


def apply(state: RunState, event: Event | str, attempt: int = 0) -> RunState:
    """The state after ``event`` of ``attempt`` reached a row in ``state``.

    Returns ``state`` itself when the event changes nothing. This is the reference the store's
    conditional UPDATE implements; the unit tests hold both to it.
    """
    move = transition(event)
    if not move.allows(state, attempt):
        return state
    return RunState(move.status, move.retries_after(state, attempt), held=move.stamp is Stamp.START)


def progress(state: RunState) -> int:
    """How far a run has got: never decreases under :func:`apply`.

    ``claimed`` 0, ``published`` 1, then the attempts interleave: ``started`` of attempt *n*
    is 2n + 3, ``retrying`` after attempt *n* (stored as retries n + 1) is 2n + 4.
    """
    if state.status == Status.MISSED:
        # Beat's verdict on a run no worker was seen to start: a start may still come.
        return 0
    if state.status in TERMINAL:
        return 2**62
    if state.status == Status.CLAIMED:
        return 0
    if state.status == Status.PUBLISHED:
        return 1
    if state.status == Status.STARTED:
        return 2 * state.retries + 3
    if state.status == Status.RETRYING:
        return 2 * state.retries + 2
    # ``queued`` has not been published: before everything a worker reports.
    return -1


class Verdict(StrEnum):
    """What a worker does with a delivery whose start did not move its row."""

    #: Run the body: the row says nothing against it (the guard only skips what is known
    #: to have run, or to be running).
    RUN = "run"
    #: Do not run the body: the occurrence succeeded, or a later attempt is under way.
    SKIP = "skip"
    #: Another execution of this attempt holds the row: wait for its lease to lapse (it
    #: died) or for it to finish, and try the start again.
    WAIT = "wait"


#: Runs that ended for good: their body ran to its end (succeeded or failed: Celery
#: acknowledged it, a later delivery is a duplicate; a task that wants another try retries),
#: or they were stopped on purpose (revoked, rejected, skipped by their overlap policy). Of the
#: terminal statuses only beat's ``missed`` may still see its message run.
ENDED = TERMINAL - {Status.MISSED}


def second_delivery(state: RunState | None, attempt: int) -> Verdict:
    """The verdict on a delivery of ``attempt`` whose start left a row in ``state`` unmoved
    (None: no row, which the guard cannot judge)."""
    if state is None:
        return Verdict.RUN
    if state.status in ENDED:
        return Verdict.SKIP
    if state.status in ON_WORKER and state.retries > attempt:
        return Verdict.SKIP
    if state.status in IN_FLIGHT or state.status == Status.MISSED:
        # Held by a live execution, or moved by a concurrent start: look again.
        return Verdict.WAIT
    return Verdict.RUN


def bounded(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to at most ``limit`` characters (marked with an ellipsis when cut)."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "\u2026"


def with_traceback(error: str, traceback: str | None) -> str:
    """``error`` (the ``Type: message`` line), then a blank line and the last
    :data:`MAX_TRACEBACK` characters of ``traceback`` (marked with an ellipsis when cut)."""
    if not traceback or not traceback.strip():
        return error
    text = traceback.rstrip()
    if len(text) > MAX_TRACEBACK:
        text = "\u2026" + text[-(MAX_TRACEBACK - 1) :]
    return f"{error}\n\n{text}"


def describe_error(exc: BaseException, limit: int = MAX_TEXT) -> str:
    """``"ExceptionType: message"``, bounded, for a run row's ``error`` column."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not cost the ledger entry
        message = ""
    if not message or message.startswith(name):
        # Some exceptions (Celery's TimeLimitExceeded) already render as "Name(...)".
        return bounded(message or name, limit)
    return bounded(f"{name}: {message}", limit)
