"""The HTTP endpoint of the external trigger (``voltro-beat serve-trigger``): a small ASGI app.

``POST /trigger/<name>`` with ``Authorization: Bearer <token>`` fires the external entry
``name`` as ``voltro-beat trigger`` does, and answers 202 (published, with the key), 200
(claimed before: nothing published), 401 (no or a wrong token; nothing else is looked at),
404 (no such entry, or one beat fires), 422 (too far from an occurrence) or 503 (store or
broker failing). The token is compared in constant time; it comes from the environment or a
file, never from the command line (which ``ps`` shows to everyone), and is never logged.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from voltro_beat.exceptions import (
    ConfigurationError,
    NotExternal,
    NotPublished,
    StoreError,
    TooFar,
)
from voltro_beat.trigger import Trigger

TOKEN_VARIABLE = "VOLTRO_BEAT_TRIGGER_TOKEN"
TOKEN_FILE_VARIABLE = "VOLTRO_BEAT_TRIGGER_TOKEN_FILE"

_UNAUTHORIZED = {"detail": "a valid bearer token is required"}


def token_from_environment(environ: Mapping[str, str] | None = None) -> str:
    """The bearer token: ``VOLTRO_BEAT_TRIGGER_TOKEN``, or the contents of the file that
    ``VOLTRO_BEAT_TRIGGER_TOKEN_FILE`` names (a mounted Kubernetes Secret), stripped."""
    env = os.environ if environ is None else environ
    token, path = env.get(TOKEN_VARIABLE), env.get(TOKEN_FILE_VARIABLE)
    if token and path:
        raise ConfigurationError(
            f"set {TOKEN_VARIABLE} or {TOKEN_FILE_VARIABLE}, not both", field=TOKEN_VARIABLE
        )
    if path:
        try:
            token = Path(path).read_text()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the token file {path!r}: {exc.strerror}", field=TOKEN_FILE_VARIABLE
            ) from None
    token = (token or "").strip()
    if not token:
        raise ConfigurationError(
            f"the endpoint needs a token: set {TOKEN_VARIABLE} or {TOKEN_FILE_VARIABLE}",
            field=TOKEN_VARIABLE,
        )
    return token


def create_app(trigger: Trigger, token: str) -> Starlette:
    """The ASGI app firing ``trigger``'s entries for requests bearing ``token``; closes the
    trigger when the server stops."""
    expected = token.encode()

    async def fire(request: Request) -> JSONResponse:
        scheme, _, supplied = request.headers.get("authorization", "").partition(" ")
        # Compared in constant time whatever was sent; bytes, so any text compares.
        good = hmac.compare_digest(supplied.strip().encode(), expected)
        if scheme.lower() != "bearer" or not good:
            return JSONResponse(_UNAUTHORIZED, 401, headers={"WWW-Authenticate": "Bearer"})
        name = request.path_params["name"]
        try:
            fired = await run_in_threadpool(trigger.fire, name)
        except NotExternal as exc:
            return JSONResponse({"detail": str(exc)}, 404)
        except TooFar as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        except (NotPublished, StoreError) as exc:
            return JSONResponse({"detail": str(exc)}, 503)
        o = fired.occurrence
        body = {
            "key": o.key,
            "task_id": o.task_id,
            "scheduled_at": o.scheduled_at.isoformat(),
            "published": fired.published,
        }
        return JSONResponse(body, 202 if fired.published else 200)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            trigger.close()

    return Starlette(routes=[Route("/trigger/{name}", fire, methods=["POST"])], lifespan=lifespan)
