"""The revision a boot compares the schema with, without loading Alembic, is the scripts'."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from voltro_beat.store.migrations.runner import HEAD, SCRIPTS


def test_head_is_the_newest_migration() -> None:
    assert ScriptDirectory(SCRIPTS).get_current_head() == HEAD
