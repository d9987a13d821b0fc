"""The errors voltro_beat raises. Everything derives from :class:`VoltroBeatError`."""

from __future__ import annotations


class VoltroBeatError(Exception):
    """Base class of every error raised by voltro_beat."""


class ConfigurationError(VoltroBeatError):
    """A schedule entry or a setting is invalid.

    ``entry`` names the ``beat_schedule`` entry (or ``None`` for a global setting; a
    singleton's name, with ``kind="singleton"``) and ``field`` the offending field or setting,
    so the message points at the line to fix; ``message`` is what is wrong, without them.
    """

    def __init__(
        self,
        message: str,
        *,
        entry: str | None = None,
        field: str | None = None,
        kind: str = "schedule",
    ):
        self.message = message
        self.entry = entry
        self.field = field
        where = []
        if entry is not None:
            where.append(f"{kind} {entry!r}")
        if field is not None:
            where.append(f"{'field' if entry is not None else 'setting'} {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class StoreError(VoltroBeatError):
    """The store (database) failed; the driver's error is chained as ``__cause__``.

    ``check`` is set when no retry cures it (a wrong password, a database that does not
    exist, a missing grant, an unknown host): what the operator should check.
    """

    def __init__(self, message: str, *, check: str | None = None) -> None:
        super().__init__(message)
        self.check = check


class NaiveDatetimeError(VoltroBeatError, ValueError):
    """A naive datetime was given where an aware instant is required (guarantee 8)."""


class NotExternal(VoltroBeatError):
    """The external trigger was asked for no entry of that name, or one that beat fires
    itself."""


class TooFar(VoltroBeatError):
    """A trigger's arrival is further than the entry's ``max_lateness`` from any occurrence
    before it (or the occurrence's deadline passed while it was being claimed)."""


class NotPublished(VoltroBeatError):
    """A triggered occurrence was claimed, but the broker did not take its message: recovery
    republishes it."""


class PublishError(VoltroBeatError):
    """The broker failed before it answered for every message: it answered for the first
    ``confirmed`` ones, and of those it refused the ones in ``refused`` (index -> the
    broker's reason) and took the rest."""

    def __init__(
        self, message: str, *, confirmed: int, refused: dict[int, str] | None = None
    ) -> None:
        super().__init__(message)
        self.confirmed = confirmed
        self.refused = refused or {}


class EditRefused(VoltroBeatError):
    """A change of the schedules table was refused: the schedule changed since the revision
    the change was based on, exists already, or does not exist (``name``)."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name
