"""``voltro-beat config``: every setting, its value and where it came from, in the order
flag > environment > app setting > default (click's runner, an importable app module)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from voltro_beat.cli import main
from voltro_beat.config import SETTINGS

#: No voltro_beat variable of the test's own environment reaches the command.
CLEAN = {setting.env: None for setting in SETTINGS} | {"VOLTRO_BEAT_CELERY_APP": None}


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable Celery app that sets the store (with a password), the lateness and the
    replica, and its time zone."""
    name = f"cli_config_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery({name!r})\n"
        "app.conf.voltro_beat_store_url = 'postgresql+psycopg://beat:app-secret@db/app'\n"
        "app.conf.voltro_beat_max_lateness = 120\n"
        "app.conf.voltro_beat_replica = 'from-the-app'\n"
        "app.conf.timezone = 'Europe/Paris'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def rows(output: str) -> dict[str, tuple[str, str]]:
    """The table's rows: ``{setting: (value, from)}``."""
    found = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 3:
            found[cells[0]] = (cells[1], cells[2])
    return found


def config(*args: str, env: dict[str, str] | None = None) -> str:
    out = CliRunner().invoke(main, ["config", *args], env={**CLEAN, **(env or {})})
    assert out.exit_code == 0, out.output
    return out.output


def test_a_flag_then_the_environment_then_the_app_then_the_default(app_module: str) -> None:
    env = {
        "VOLTRO_BEAT_STORE_URL": "postgresql+psycopg://beat:env-secret@db/env",
        "VOLTRO_BEAT_REPLICA": "from-the-environment",
    }
    flag = "sqlite:///flag.db"
    table = rows(config("-A", app_module, "--store", flag, env=env))
    # The store is set three ways: the flag wins.
    assert table["voltro_beat_store_url"] == (flag, "flag --store")
    # Set by the app and the environment: the environment wins.
    assert table["voltro_beat_replica"] == (
        "from-the-environment",
        "environment VOLTRO_BEAT_REPLICA",
    )
    # By the app only.
    assert table["voltro_beat_max_lateness"] == ("120 s", "app setting voltro_beat_max_lateness")
    assert table["timezone"] == ("Europe/Paris", "app setting timezone")
    # By nobody.
    assert table["voltro_beat_runs_ttl_hours"] == ("720 h", "default")
    assert table["voltro_beat_metrics_port"] == ("off", "default")
    assert set(table) == {*(s.key for s in SETTINGS), "timezone"}

    # Without the flag, the environment's store; without that too, the app's, its password
    # hidden.
    assert rows(config("-A", app_module, env=env))["voltro_beat_store_url"] == (
        "postgresql+psycopg://beat:***@db/env",
        "environment VOLTRO_BEAT_STORE_URL",
    )
    by_app = config("-A", app_module)
    assert rows(by_app)["voltro_beat_store_url"] == (
        "postgresql+psycopg://beat:***@db/app",
        "app setting voltro_beat_store_url",
    )
    assert "secret" not in by_app
    # Without an app, the defaults.
    assert rows(config())["voltro_beat_store_url"] == ("sqlite:///voltro-beat.sqlite3", "default")


def test_json_one_object_per_setting(app_module: str) -> None:
    output = config("-A", app_module, "--json", env={"VOLTRO_BEAT_MIGRATE": "false"})
    lines = [json.loads(line) for line in output.splitlines()]
    by_key = {line["setting"]: line for line in lines}
    assert len(lines) == len(SETTINGS) + 1
    assert by_key["voltro_beat_store_url"] == {
        "setting": "voltro_beat_store_url",
        "value": "postgresql+psycopg://beat:***@db/app",
        "source": "app setting",
        "name": "voltro_beat_store_url",
    }
    assert by_key["voltro_beat_migrate"] == {
        "setting": "voltro_beat_migrate",
        "value": False,
        "source": "environment",
        "name": "VOLTRO_BEAT_MIGRATE",
    }
    assert by_key["voltro_beat_runs_ttl_hours"]["value"] == 720
    assert by_key["voltro_beat_publish_timeout"]["value"] == 10
    assert (by_key["voltro_beat_clock"]["value"], by_key["timezone"]["value"]) == (
        None,
        "Europe/Paris",
    )


def test_a_bad_value_is_one_line_naming_the_setting_and_its_variable(app_module: str) -> None:
    out = CliRunner().invoke(
        main, ["config", "-A", app_module], env={**CLEAN, "VOLTRO_BEAT_MAX_LATENESS": "soon"}
    )
    assert out.exit_code == 1
    assert out.output == (
        "Error: setting 'voltro_beat_max_lateness': expected seconds or a timedelta, got "
        "'soon' (from environment VOLTRO_BEAT_MAX_LATENESS)\n"
    )


@pytest.mark.parametrize("command", ["trigger", "serve-trigger", "status", "backfill", "admin"])
def test_every_command_that_reads_the_store_takes_store(command: str) -> None:
    out = CliRunner().invoke(main, [command, "--help"])
    assert out.exit_code == 0, out.output
    assert "--store URL" in out.output
