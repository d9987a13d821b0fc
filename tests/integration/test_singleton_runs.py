"""Singletons run by a replica (``voltro_beat.engine.singletons``) on a real store, SQLite and
PostgreSQL, with real threads: started where the shard is held, stopped when it moves,
failures recorded and restarted only when asked."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa

from voltro_beat.config import Settings
from voltro_beat.engine.singletons import Singletons
from voltro_beat.shards import shard_of
from voltro_beat.singletons import Context, Singleton
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.tables import singletons as table

SETTINGS = Settings.resolve(
    {"voltro_beat_coordination": "cluster", "voltro_beat_shards": 8},
    overrides={"replica": "a"},
    environ={},
)
SHARD = shard_of("default", "inbox", 8)
Stores = Callable[[str], BeatStore]


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def state(store: BeatStore) -> tuple[str, int, str | None]:
    with store.database.connect() as conn:
        row = conn.execute(sa.select(table.c.state, table.c.token, table.c.error)).one()
    return row.state, row.token, row.error


def runner(store: BeatStore, run: Callable[[Context], object], **options: object) -> Singletons:
    spec = {"restart": False, "grace": timedelta(seconds=1), **options}
    s = Singleton("inbox", "default", run, where="tests:inbox", **spec)  # type: ignore[arg-type]
    return Singletons([s], store, SETTINGS)


def test_it_runs_while_its_shard_is_held_and_a_new_owner_epoch_starts_a_fresh_copy(
    stores: Stores,
) -> None:
    store = stores("a")
    seen: list[tuple[str, int]] = []

    def run(context: Context) -> None:
        seen.append(("start", context.token))
        context.stop.wait(30)
        seen.append(("stop", context.token))

    singletons = runner(store, run)
    singletons.follow({SHARD: 1})
    eventually(lambda: seen == [("start", 1)])
    assert state(store) == ("running", 1, None)
    singletons.follow({SHARD: 1})  # still its owner: nothing new
    singletons.follow({})  # the shard moved away
    eventually(lambda: seen[-1] == ("stop", 1))
    singletons.follow({})
    assert state(store)[:2] == ("stopped", 1)
    singletons.follow({SHARD: 3})
    eventually(lambda: seen[-1] == ("start", 3))
    assert state(store) == ("running", 3, None)
    singletons.stop_all()
    assert seen[-1] == ("stop", 3) and state(store)[0] == "stopped"


def test_a_returned_singleton_runs_again_only_when_ownership_moves(stores: Stores) -> None:
    store = stores("a")
    runs: list[int] = []
    singletons = runner(store, lambda context: runs.append(context.token))
    singletons.follow({SHARD: 1})
    eventually(lambda: runs == [1])
    for _ in range(3):
        singletons.follow({SHARD: 1})
    assert runs == [1] and state(store)[0] == "returned"
    singletons.follow({SHARD: 2})
    eventually(lambda: runs == [1, 2])


@pytest.mark.parametrize("restart", [False, True])
def test_a_failure_is_recorded_with_its_traceback_and_restarted_only_when_asked(
    stores: Stores, restart: bool, caplog: pytest.LogCaptureFixture
) -> None:
    store = stores("a")
    calls: list[int] = []

    def run(context: Context) -> None:
        calls.append(context.token)
        raise RuntimeError("inbox unreachable")

    singletons = runner(store, run, restart=restart)
    singletons.follow({SHARD: 1})
    eventually(lambda: calls == [1])
    time.sleep(0.1)
    singletons.follow({SHARD: 1})
    status, token, error = state(store)
    assert (status, token) == ("failed", 1)
    assert "RuntimeError: inbox unreachable" in (error or "")
    assert "inbox unreachable" in caplog.text
    time.sleep(1.2)  # the first backoff
    singletons.follow({SHARD: 1})
    time.sleep(0.2)
    assert calls == ([1, 1] if restart else [1])


def test_a_copy_that_ignores_its_stop_is_reported_once_its_grace_is_over(
    stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    store = stores("a")
    release = threading.Event()
    singletons = runner(store, lambda context: release.wait(30), grace=timedelta(seconds=0.2))
    singletons.follow({SHARD: 1})
    singletons.follow({})
    time.sleep(0.3)
    with caplog.at_level(logging.ERROR):
        singletons.follow({SHARD: 2})  # not started again while the old copy runs
        assert "has not returned 0.2 s after it was asked to stop" in caplog.text
    assert state(store)[:2] == ("running", 1)
    release.set()
    eventually(lambda: (singletons.follow({SHARD: 2}), state(store)[1] == 2)[1])
