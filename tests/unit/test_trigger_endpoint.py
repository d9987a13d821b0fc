"""The trigger endpoint's token and its answers, with a stand-in for the trigger (the real one,
on a real store, broker and worker, is tests/acceptance/test_trigger.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from voltro_beat.contrib.trigger_endpoint import create_app, token_from_environment
from voltro_beat.exceptions import (
    ConfigurationError,
    NotExternal,
    NotPublished,
    StoreError,
    TooFar,
)
from voltro_beat.occurrences import Occurrence
from voltro_beat.trigger import Fired, Trigger

TOKEN = "s3cret-t0ken"
AT = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)


class Stand:
    """Answers ``fire`` as told and remembers the names it was asked for."""

    def __init__(self, answer: Fired | Exception) -> None:
        self.answer = answer
        self.fired: list[str] = []
        self.closed = False

    def fire(self, name: str) -> Fired:
        self.fired.append(name)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        self.closed = True


def request(
    answer: Fired | Exception, method: str, path: str, headers: dict[str, Any] | None = None
) -> tuple[httpx.Response, Stand]:
    """One request to a fresh app, between its start-up and its shut-down."""
    stand = Stand(answer)
    app = create_app(cast(Trigger, stand), TOKEN)

    async def call() -> httpx.Response:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
            ) as http,
        ):
            return await http.request(method, path, headers=headers)

    return asyncio.run(call()), stand


PUBLISHED = Fired(Occurrence.of("nightly", AT), published=True)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer sécret".encode("latin-1")},
    ],
)
def test_no_or_a_wrong_token_is_401_and_fires_nothing(headers: dict[str, Any]) -> None:
    answer, stand = request(PUBLISHED, "POST", "/trigger/nightly", headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert stand.fired == []


@pytest.mark.parametrize(
    ("answer", "status", "published"),
    [
        (PUBLISHED, 202, True),
        (Fired(PUBLISHED.occurrence, published=False), 200, False),
    ],
)
def test_published_is_202_and_claimed_before_is_200(
    answer: Fired, status: int, published: bool
) -> None:
    reply, stand = request(answer, "POST", "/trigger/nightly", {"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == status
    assert reply.json() == {
        "key": "nightly@2026-03-01T02:00:00",
        "task_id": PUBLISHED.occurrence.task_id,
        "scheduled_at": "2026-03-01T02:00:00+00:00",
        "published": published,
    }
    assert stand.fired == ["nightly"]
    assert stand.closed  # when the server stops


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotExternal("no schedule 'x' in beat_schedule"), 404),
        (TooFar("x: no occurrence within max_lateness"), 422),
        (NotPublished("x@...: claimed, but the broker did not take it"), 503),
        (StoreError("connection refused"), 503),
    ],
)
def test_errors_have_their_status(error: Exception, status: int) -> None:
    reply, _ = request(error, "POST", "/trigger/x", {"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == status
    assert reply.json() == {"detail": str(error)}


def test_only_post_is_served() -> None:
    reply, stand = request(PUBLISHED, "GET", "/trigger/nightly")
    assert reply.status_code == 405
    assert stand.fired == []


def test_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert token_from_environment({"VOLTRO_BEAT_TRIGGER_TOKEN": f" {TOKEN}\n"}) == TOKEN
    secret = tmp_path / "token"
    secret.write_text(f"{TOKEN}\n")
    assert token_from_environment({"VOLTRO_BEAT_TRIGGER_TOKEN_FILE": str(secret)}) == TOKEN


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"VOLTRO_BEAT_TRIGGER_TOKEN": "  "},
        {"VOLTRO_BEAT_TRIGGER_TOKEN_FILE": "/nonexistent/token"},
        {"VOLTRO_BEAT_TRIGGER_TOKEN": TOKEN, "VOLTRO_BEAT_TRIGGER_TOKEN_FILE": "/etc/hostname"},
    ],
)
def test_no_usable_token_is_a_configuration_error(environ: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="VOLTRO_BEAT_TRIGGER_TOKEN") as caught:
        token_from_environment(environ)
    assert TOKEN not in str(caught.value)
