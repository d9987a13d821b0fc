"""Which prepared message each schedule sends: one template per shape (task, options,
serializer: :func:`voltro_beat.messages.shape`), shared by every schedule of that shape, each
filling in its own arguments; a schedule whose message is not its shape's with other arguments
keeps a template of its own. The publisher builds a template from Celery's send path the first
time a shape is met, and sends what this keeps."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from voltro_beat.messages import Arguments, RedisPush, SendPath, Template, replayable, shape

if TYPE_CHECKING:
    from voltro_beat.schedules import Entry


class Prepared(NamedTuple):
    """One schedule's message: a template (its own, or its shape's) and what the schedule fills
    in: for a :class:`RedisPush` its arguments' JSON (:meth:`RedisPush.fill`), for a
    :class:`Template` its :class:`Arguments` (None: the template's own)."""

    template: RedisPush | Template
    fill: Any


@dataclass(slots=True)
class _Shared:
    """The template of one shape (None: Celery's full path), and how many schedules use it."""

    #: The shape, one object for all its schedules (a schedule's own copy would cost a hundred
    #: bytes or so each).
    key: Hashable
    template: RedisPush | Template | None
    users: int = 0


class Templates:
    """Per schedule, its prepared message (None: Celery's full path), shared per shape."""

    def __init__(self) -> None:
        #: Per schedule: its captured Redis payload, else its recorded publish call, with what
        #: it fills in; or None for Celery's full path.
        self.prepared: dict[str, Prepared | None] = {}
        #: Per shape in use: its template, and how many schedules use it.
        self.shapes: dict[Hashable, _Shared] = {}
        #: Per schedule with a shape: that shape.
        self._shape_of: dict[str, Hashable] = {}

    def of(
        self, path: SendPath, entry: Entry, build: Callable[[], Prepared | None]
    ) -> Prepared | None:
        """``entry``'s prepared message: its shape's template filled in, or what ``build``
        makes of Celery's send path (the first of a shape, or a schedule of no shape)."""
        try:
            return self.prepared[entry.name]
        except KeyError:
            pass
        kind = shape(path, entry) if replayable(path, entry) else None
        shared = None if kind is None else self.shapes.get(kind)
        prepared: Prepared | None
        if shared is not None:
            prepared = None
            if shared.template is not None:
                prepared = filled(shared.template, Arguments.of(path, entry))
        else:
            prepared = build()
            if kind is not None and (prepared is None or _shareable(path, entry, prepared)):
                template = None if prepared is None else prepared.template
                shared = self.shapes[kind] = _Shared(kind, template)
        if shared is not None:
            shared.users += 1
            self._shape_of[entry.name] = shared.key
        self.prepared[entry.name] = prepared
        return prepared

    def forget(self, name: str) -> None:
        """Forget schedule ``name``'s message (its definition changed): it is prepared again,
        by its new shape. A shape no schedule uses any more is dropped."""
        self.prepared.pop(name, None)
        kind = self._shape_of.pop(name, None)
        if kind is not None:
            shared = self.shapes[kind]
            shared.users -= 1
            if not shared.users:
                del self.shapes[kind]


def recorded_arguments(recorded: Template) -> Arguments:
    """The arguments of the message Celery's send path made for ``recorded``."""
    args, kwargs, _ = recorded.body
    headers = recorded.kwargs["headers"]
    return Arguments(args, kwargs, headers["argsrepr"], headers["kwargsrepr"])


def filled(template: RedisPush | Template, arguments: Arguments) -> Prepared:
    """``template`` with ``arguments`` to fill in."""
    if isinstance(template, RedisPush):
        return Prepared(template, template.fill(arguments))
    return Prepared(template, arguments)


def _shareable(path: SendPath, entry: Entry, prepared: Prepared) -> bool:
    """Whether the arguments of ``entry`` as :meth:`Arguments.of` makes them are the ones
    Celery's send path wrote in its message: if so, the other schedules of its shape fill in
    theirs the same way; if not, each builds a template of its own."""
    mine = Arguments.of(path, entry)
    if isinstance(prepared.template, RedisPush):
        return bool(prepared.fill == prepared.template.fill(mine))
    return recorded_arguments(prepared.template) == mine
