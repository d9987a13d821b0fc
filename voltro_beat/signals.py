"""Celery wiring of the run ledger: ``voltro_beat.attach(app)``.

One line in the app module, ``voltro_beat.attach(app)``, makes every worker of that app record
the runs of the occurrences voltro_beat published in the runs table. The decisions live in
:mod:`voltro_beat.ledger` (pure) and the SQL in :mod:`voltro_beat.store.run_writer`; this
module only maps Celery signals to ledger events:

=========================  =============  ==========================================
signal                     process        event
=========================  =============  ==========================================
task_prerun                pool child     started: the start claim (and the duplicate guard)
task_retry                 child / main   retrying
task_success               pool child     succeeded
task_failure               child / main   failed, worker_lost, time_limit, rejected
task_internal_error        pool child     failed
task_postrun               pool child     rejected (``Reject(requeue=False)``)
task_revoked               main           revoked
task_unknown               main           unknown_task
task_rejected              main           rejected (a message the worker cannot read)
=========================  =============  ==========================================

A delivery is voltro_beat's when its message carries the ``voltro_occurrence`` header (Celery
copies custom headers onto ``task.request``). Where Celery's failure path offers only the task
id (the hard time limit's ``task_failure`` from the main process), the row is found by its task
id, which voltro_beat always makes a version-5 UUID: other tasks cost no query. Every handler
swallows and logs its own errors, so the ledger can never break a task.

The start is a claim (:mod:`voltro_beat.ledger`): it holds the row for this worker for
``voltro_beat_worker_lease``, renewed every third of it from a thread of the process while the
body runs. A second delivery of the same occurrence whose start does not move the row runs its
body only if the ledger says nothing against it (:func:`voltro_beat.ledger.second_delivery`):
while another execution holds the row it waits, one poll a second, for that lease to lapse
(the execution died: the start then moves the row and the body runs) or for the row to finish;
after a whole lease of renewals by a live execution it skips.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import uuid
import weakref
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery, signals
from celery.exceptions import Ignore, Reject, TimeLimitExceeded, WorkerLostError

from voltro_beat import ledger, logs
from voltro_beat.config import Settings
from voltro_beat.ledger import Event, RunState, Verdict
from voltro_beat.runner import Runner, Threads
from voltro_beat.store.database import Database
from voltro_beat.store.run_writer import RunWriter

logger = logging.getLogger(__name__)

#: The message header naming the occurrence a delivery runs (set by the publisher).
OCCURRENCE_HEADER = "voltro_occurrence"
#: Prefix of every signal receiver's ``dispatch_uid``: connecting twice is a no-op.
DISPATCH_UID = "voltro_beat.ledger"

#: Attribute of the Celery app holding its recorder (set by :func:`attach`).
_APP_ATTR = "_voltro_beat_ledger"
#: Attributes set on ``task.request`` (one Celery ``Context`` per delivery) between signals.
_DUPLICATE = "voltro_duplicate"
_STARTED_AT = "voltro_started_at"
#: Marks the ``before_start`` wrappers installed by the duplicate guard.
_GUARD_MARK = "_voltro_guard_wraps"
#: How often a second delivery looks again at a row another execution holds.
POLL = timedelta(seconds=1)


def attach(
    app: Celery,
    *,
    runner: Runner | None = None,
    now: Callable[[], datetime] | None = None,
    writer: RunWriter | None = None,
) -> None:
    """Record the runs of voltro_beat's occurrences from this app's workers.

    Call it once in the module that defines the Celery app, next to the app::

        app = Celery("proj")
        voltro_beat.attach(app)

    Idempotent, and harmless in beat and in client processes: it only connects signal
    receivers (which fire in workers) and opens no connection; each worker process opens its
    own lazily, after the fork. The store URL and the duplicate guard come from the app's
    ``voltro_beat_*`` settings, read at the first recorded event.

    ``runner`` (lease renewals, polls: threads and real time by default), ``now`` (the
    clock the run rows' stamps are read from: this host's by default) and ``writer`` (the
    ledger's writer: by default one per process, on the app's store) are seams for a
    simulation (tests/sim), which runs workers on a virtual timeline.
    """
    recorder = getattr(app, _APP_ATTR, None)
    seams = {"runner": runner, "now": now, "writer": writer}
    if not isinstance(recorder, _Recorder) or any(v is not None for v in seams.values()):
        setattr(app, _APP_ATTR, _Recorder(app, runner=runner, now=now, writer=writer))
    _connect_receivers()
    if app.finalized:
        # Tasks already bound (say, attach() after the worker started importing): wrap them
        # now; worker_init wraps whatever is registered later, before the tracers are built.
        _install_guard(app)


class _Recorder:
    """One app's ledger writer in one process: opened lazily, once per process."""

    def __init__(
        self,
        app: Celery,
        *,
        runner: Runner | None = None,
        now: Callable[[], datetime] | None = None,
        writer: RunWriter | None = None,
    ) -> None:
        self.app = app
        #: The writer handed in (kept across forks: its owner manages it), else None.
        self._given = writer
        #: Renews the start claims and waits between polls (a forked child makes its own).
        self._own_runner = runner is None
        self.runner: Runner = runner or Threads("voltro-beat-worker")
        #: The clock of the rows' stamps (started_at, finished_at).
        self.now = now or _utc_now
        #: The worker's node name, for rows written by its main process.
        self.hostname: str | None = None
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._writer: RunWriter | None = None
        self._guard = True
        self._lease = timedelta(seconds=30)
        self._failing = False
        #: The runs this process started and holds (key -> worker), renewed by its renewer.
        self._held: dict[str, str] = {}
        self._renewing = False
        _RECORDERS.add(self)

    def writer(self) -> RunWriter | None:
        """This process's writer, opened on first use; None if the ledger cannot be written."""
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    # A forked child must never use the parent's pooled connections.
                    self._drop()
                    self._open()
                    self._pid = pid
        return self._writer

    @property
    def guard(self) -> bool:
        """Whether the duplicate delivery guard is on (read with the settings)."""
        self.writer()
        return self._guard

    @property
    def lease(self) -> timedelta:
        """How long a start claim holds its row without a renewal (read with the settings)."""
        self.writer()
        return self._lease

    def reset(self) -> None:
        """Forget the writer (in a freshly forked child); the next event opens a new one."""
        with self._lock:
            self._drop()
            self._pid = None
            # The parent's renewer thread did not survive the fork, nor do its runs belong here.
            self._held = {}
            self._renewing = False
            if self._own_runner:
                self.runner = Threads("voltro-beat-worker")

    def start(self, key: str, *, attempt: int, worker: str) -> Verdict:
        """Claim the start of ``key``'s ``attempt`` for ``worker``: the verdict on its body.

        RUN if the start moved the row (it is then held and renewed until :meth:`release`),
        or if the ledger cannot tell (no row, unwritable: the ledger never stops a task on
        its own failure); SKIP for a second delivery the guard stops.
        """
        # Polls for a whole lease and one more: a live execution renews within that.
        polls = math.ceil(self.lease / POLL) + 1
        while True:
            moved = self.record(
                Event.STARTED,
                now=self.now(),
                key=key,
                attempt=attempt,
                worker=worker,
                lease=self.lease,
            )
            if moved:
                self._hold(key, worker)
                return Verdict.RUN
            if moved is None or not self.guard:
                return Verdict.RUN
            verdict = ledger.second_delivery(self.state(key), attempt)
            if verdict is not Verdict.WAIT:
                return verdict
            if polls == 0:
                # Renewed for a whole lease: the other execution is alive.
                return Verdict.SKIP
            polls -= 1
            self.runner.sleep(POLL.total_seconds())

    def release(self, key: str) -> None:
        """Stop renewing ``key`` (its delivery ended, whatever way)."""
        with self._lock:
            self._held.pop(key, None)

    def duplicate(self, key: str) -> None:
        """Count a delivery of ``key`` whose body did not run."""
        writer = self.writer()
        if writer is None:
            return
        try:
            writer.count_duplicate(key)
        except Exception as exc:
            self._failed("a duplicate delivery", exc, key=key)

    def record(self, event: Event, *, now: datetime, **fields: Any) -> bool | None:
        """Apply ``event`` to its row: True if it moved, False if not, None if unwritable.

        ``fields`` are :meth:`RunWriter.advance`'s keywords (key or task_id, attempt, worker,
        started_at, reason, error).
        """
        writer = self.writer()
        if writer is None:
            return None
        try:
            moved = writer.advance(ledger.transition(event), now=now, **fields)
        except Exception as exc:
            self._failed(event, exc, key=fields.get("key"), task_id=fields.get("task_id"))
            return None
        self._recovered()
        return moved

    def state(self, key: str) -> RunState | None:
        """The recorded state of ``key`` (None if unknown or unreadable)."""
        writer = self.writer()
        if writer is None:
            return None
        try:
            state = writer.state(key)
        except Exception as exc:
            self._failed("status read", exc, key=key)
            return None
        self._recovered()
        return state

    def _hold(self, key: str, worker: str) -> None:
        with self._lock:
            self._held[key] = worker
            start = not self._renewing
            self._renewing = True
        if start:  # for as long as the process lives
            self.runner.every(self.lease.total_seconds() / 3, self._renew)

    def _renew(self) -> None:
        """Renew the leases of the runs this process holds (every third of a lease)."""
        with self._lock:
            held = dict(self._held)
        writer = self.writer() if held else None
        if writer is None:
            return
        for key, worker in held.items():
            try:
                writer.renew(key, worker=worker, lease=self.lease)
            except Exception as exc:
                self._failed("a worker lease", exc, key=key)

    def _open(self) -> None:
        try:
            settings = Settings.resolve(self.app.conf)
            writer = self._given or RunWriter(Database.open(settings.store_url))
        except Exception as exc:
            # A configuration error is the beat's to report; workers keep running tasks.
            logger.error("voltro_beat ledger disabled in this process: %s", exc)
            return
        self._guard = settings.duplicate_guard
        self._lease = settings.worker_lease
        self._writer = writer

    def _drop(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None and writer is not self._given:
            writer.discard()

    def _failed(
        self, what: object, exc: Exception, *, key: str | None, task_id: str | None = None
    ) -> None:
        # One warning per outage, not one per task.
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        logger.log(
            level,
            "voltro_beat ledger: could not record %s for %s: %s",
            what,
            key or task_id,
            exc,
            extra=logs.fields(key=key),
        )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            logger.warning("voltro_beat ledger: recording again")


_RECORDERS: weakref.WeakSet[_Recorder] = weakref.WeakSet()


def _recorder(app: Any) -> _Recorder | None:
    recorder = getattr(app, _APP_ATTR, None)
    return recorder if isinstance(recorder, _Recorder) else None


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _occurrence(request: Any) -> str | None:
    """The occurrence key a delivery carries, or None for tasks voltro_beat did not publish."""
    key = getattr(request, OCCURRENCE_HEADER, None)
    if key is None:
        headers = getattr(request, "headers", None)
        if isinstance(headers, dict):
            key = headers.get(OCCURRENCE_HEADER)
    return key if isinstance(key, str) and key else None


def _may_be_ours(task_id: Any) -> bool:
    """Whether ``task_id`` can be an occurrence's: voltro_beat's task ids are uuid5."""
    try:
        return uuid.UUID(str(task_id)).version == 5
    except ValueError:
        return False


def _worker(hostname: str | None) -> str:
    return f"{hostname or 'unknown'}:{os.getpid()}"


def _quietly(handler: Callable[..., None]) -> Callable[..., None]:
    """Log, never raise: a ledger problem must not break the task or the worker."""

    def receiver(*args: Any, **kwargs: Any) -> None:
        try:
            handler(*args, **kwargs)
        except Exception:
            logger.exception("voltro_beat ledger: %s failed", handler.__name__)

    receiver.__name__ = handler.__name__
    receiver.__qualname__ = handler.__qualname__
    return receiver


# -- pool child: the task's own request is current ------------------------------------------


@_quietly
def _on_prerun(sender: Any = None, task_id: Any = None, task: Any = None, **_: Any) -> None:
    task = task if task is not None else sender
    request = task.request
    key = _occurrence(request)
    if key is None:
        return
    recorder = _recorder(task.app)
    if recorder is None:
        return
    setattr(request, _STARTED_AT, recorder.now())
    # The guard costs nothing on the normal path: only a start that did not move the row
    # reads it.
    verdict = recorder.start(key, attempt=request.retries or 0, worker=_worker(request.hostname))
    if verdict is Verdict.RUN:
        return
    if getattr(type(task).before_start, _GUARD_MARK, None) is None:
        logger.warning(
            "voltro_beat: occurrence %s already ran or is running, but task %s has no "
            "duplicate guard (was voltro_beat.attach(app) called before the worker started?); "
            "running it again",
            key,
            task.name,
            extra=logs.fields(key=key),
        )
        return
    setattr(request, _DUPLICATE, True)
    recorder.duplicate(key)
    logger.info(
        "voltro_beat: occurrence %s already succeeded or is running elsewhere; skipping "
        "duplicate delivery %s",
        key,
        task_id,
        extra=logs.fields(key=key),
    )


@_quietly
def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    key = _occurrence(request)
    recorder = _recorder(sender.app) if key is not None else None
    if recorder is None:
        return
    recorder.record(
        Event.RETRYING,
        now=recorder.now(),
        key=key,
        attempt=request.retries or 0,
        reason=ledger.bounded(str(reason)),
    )


@_quietly
def _on_success(sender: Any = None, **_: Any) -> None:
    request = sender.request
    key = _occurrence(request)
    recorder = _recorder(sender.app) if key is not None else None
    if recorder is None:
        return
    recorder.record(
        Event.SUCCEEDED,
        now=recorder.now(),
        key=key,
        worker=_worker(request.hostname),
        started_at=getattr(request, _STARTED_AT, None),
    )


@_quietly
def _on_internal_error(
    sender: Any = None, task_id: Any = None, exception: Any = None, **_: Any
) -> None:
    _finish_by_request(sender, task_id, Event.FAILED, error=_describe(exception))


@_quietly
def _on_postrun(
    sender: Any = None, task_id: Any = None, retval: Any = None, state: Any = None, **_: Any
) -> None:
    key = _occurrence(sender.request) if sender is not None else None
    if key is not None and (recorder := _recorder(sender.app)) is not None:
        recorder.release(key)
    # Older Celery versions send no task_failure for a task that raised Reject(requeue=False)
    # (5.7 does; the second report changes nothing). A requeued one runs again: not the end.
    if state == "REJECTED" and isinstance(retval, Reject) and not retval.requeue:
        _finish_by_request(sender, task_id, Event.REJECTED, error=_describe(retval))


# -- either process: task_failure ------------------------------------------------------------


@_quietly
def _on_failure(
    sender: Any = None, task_id: Any = None, exception: Any = None, einfo: Any = None, **_: Any
) -> None:
    if isinstance(exception, WorkerLostError):
        event = Event.WORKER_LOST
    elif isinstance(exception, TimeLimitExceeded):
        event = Event.TIME_LIMIT
    elif isinstance(exception, Reject):
        event = Event.REJECTED
    else:
        event = Event.FAILED
    error = _describe(exception)
    if event is Event.FAILED and error is not None:
        # The task's own traceback (Celery formats it in einfo): the error line says what,
        # the traceback where. Not for a lost worker or a time limit: theirs is Celery's.
        error = ledger.with_traceback(error, getattr(einfo, "traceback", None))
    _finish_by_request(sender, task_id, event, error=error)


def _finish_by_request(task: Any, task_id: Any, event: Event, **fields: Any) -> None:
    """Record a terminal event of ``task``'s delivery ``task_id``, by key or else by task id."""
    recorder = _recorder(task.app)
    if recorder is None:
        return
    request = task.request
    # The current request is the failing delivery in the pool child, and in the main process
    # when Celery pushed its context: then its headers decide, and a delivery without the
    # header is not voltro_beat's even if its task id looks like one. The hard time limit's
    # path pushes no context: only then is the task id all there is.
    if request is not None and request.id == task_id:
        key = _occurrence(request)
        if key is None:
            return
        recorder.record(
            event,
            now=recorder.now(),
            key=key,
            worker=_worker(request.hostname),
            started_at=getattr(request, _STARTED_AT, None),
            **fields,
        )
    elif _may_be_ours(task_id):
        recorder.record(
            event,
            now=recorder.now(),
            task_id=str(task_id),
            worker=_worker(recorder.hostname),
            **fields,
        )


# -- main process: paths where the task never ran (or its child is gone) ---------------------


@_quietly
def _on_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: Any = None,
    signum: Any = None,
    expired: Any = None,
    **_: Any,
) -> None:
    recorder = _recorder(sender.app) if sender is not None else None
    if recorder is None or request is None:
        return
    if expired:
        reason = "expired"
    elif terminated:
        reason = f"terminated by signal {signum}" if signum else "terminated"
    else:
        reason = "revoked"
    # ``request`` is the revoked delivery's own context, headers included.
    key = _occurrence(request)
    if key is not None:
        recorder.record(
            Event.REVOKED,
            now=recorder.now(),
            key=key,
            reason=reason,
            worker=_worker(recorder.hostname),
        )


@_quietly
def _on_unknown(sender: Any = None, name: Any = None, message: Any = None, **_: Any) -> None:
    _record_message(sender, message, Event.UNKNOWN_TASK, ledger.bounded(f"NotRegistered: {name!r}"))


@_quietly
def _on_rejected(sender: Any = None, message: Any = None, exc: Any = None, **_: Any) -> None:
    error = _describe(exc) if exc is not None else "the worker cannot decode this message"
    _record_message(sender, message, Event.REJECTED, error)


def _record_message(sender: Any, message: Any, event: Event, error: str | None) -> None:
    """Record ``event`` for a message the worker's main process gave up on before a request."""
    key = _occurrence_of_message(message)
    recorder = _recorder(sender.app) if key is not None else None
    if recorder is None:
        return
    recorder.record(
        event,
        now=recorder.now(),
        key=key,
        worker=_worker(getattr(sender, "hostname", None)),
        error=error,
    )


def _occurrence_of_message(message: Any) -> str | None:
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict):
        return None
    key = headers.get(OCCURRENCE_HEADER)
    return key if isinstance(key, str) and key else None


def _describe(exc: Any) -> str | None:
    if isinstance(exc, Reject):
        # Reject's str() is the tuple of its arguments; its reason is what the task said.
        return ledger.bounded(f"Reject: {exc.reason}")
    if isinstance(exc, TimeLimitExceeded) and exc.args:
        return f"TimeLimitExceeded: hard time limit ({exc.args[0]}s) exceeded"
    return ledger.describe_error(exc) if isinstance(exc, BaseException) else None


# -- process lifecycle -----------------------------------------------------------------------


@_quietly
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    recorder = _recorder(getattr(sender, "app", None))
    if recorder is None:
        return
    recorder.hostname = getattr(sender, "hostname", None)
    # All task modules are imported by now and the tracers, which look up before_start once,
    # are built later, when the consumer starts.
    _install_guard(sender.app)


@_quietly
def _on_worker_process_init(**_: Any) -> None:
    for recorder in list(_RECORDERS):
        recorder.reset()


# -- the duplicate guard ---------------------------------------------------------------------


def _install_guard(app: Celery) -> None:
    """Wrap every task class's ``before_start`` so that a duplicate delivery skips its body.

    Celery calls ``before_start`` inside the try block that handles ``Ignore``, just before
    the body, and only if the class overrides it: so the wrapper lives on each task class.
    Raising ``Ignore`` there acknowledges the message, stores no result, sends no
    success/failure signal, and the body never runs. The task's own ``before_start`` (if any)
    still runs for every other delivery.
    """
    for task in list(app.tasks.values()):
        cls = type(task)
        if getattr(cls.before_start, _GUARD_MARK, None) is not None:
            continue
        cls.before_start = _guarded_before_start(cls.before_start)


def _guarded_before_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        if getattr(self.request, _DUPLICATE, False):
            raise Ignore()
        return original(self, task_id, args, kwargs)

    setattr(before_start, _GUARD_MARK, original)
    before_start.__doc__ = original.__doc__
    return before_start


# -- connecting --------------------------------------------------------------------------------

_RECEIVERS: tuple[tuple[Any, Callable[..., None]], ...] = (
    (signals.task_prerun, _on_prerun),
    (signals.task_retry, _on_retry),
    (signals.task_success, _on_success),
    (signals.task_failure, _on_failure),
    (signals.task_internal_error, _on_internal_error),
    (signals.task_postrun, _on_postrun),
    (signals.task_revoked, _on_revoked),
    (signals.task_unknown, _on_unknown),
    (signals.task_rejected, _on_rejected),
    (signals.worker_init, _on_worker_init),
    (signals.worker_process_init, _on_worker_process_init),
)


def _connect_receivers() -> None:
    # Strong references (weak=False) so the receivers live as long as the process, and a fixed
    # dispatch_uid so that connecting again (attach() twice, two apps) changes nothing.
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, weak=False, dispatch_uid=f"{DISPATCH_UID}.{receiver.__name__}")
