"""Which store and which app a ``voltro-beat`` command reads: ``--store`` given on the command
line, else ``VOLTRO_BEAT_STORE_URL``, else the app's ``voltro_beat_store_url`` (``-A``), else
the embedded default; and a command that only reads never creates a store (SQLite files,
through click's runner)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from voltro_beat.cli import main


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable Celery app whose config names a SQLite store in ``tmp_path``."""
    name = f"cli_store_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery({name!r})\n"
        f"app.conf.voltro_beat_store_url = 'sqlite:///{tmp_path / 'app.db'}'\n"
        "app.conf.beat_schedule = {'poll': {'task': 't', 'schedule': 10.0}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def upgrade(*args: str, env: dict[str, str] | None = None) -> str:
    out = CliRunner().invoke(main, ["db", "upgrade", *args], env=env)
    assert out.exit_code == 0, out.output
    return out.output


def test_an_explicit_store_wins_over_the_app_and_the_environment(
    app_module: str, tmp_path: Path
) -> None:
    env = {"VOLTRO_BEAT_STORE_URL": f"sqlite:///{tmp_path / 'env.db'}"}
    flag = f"sqlite:///{tmp_path / 'flag.db'}"
    assert upgrade("-A", app_module, "--store", flag, env=env) == f"{flag}: schema is up to date\n"
    # The same whichever comes first on the line.
    assert upgrade("--store", flag, "--app", app_module, env=env) == (
        f"{flag}: schema is up to date\n"
    )


def test_then_the_environment_then_the_app(
    app_module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"VOLTRO_BEAT_STORE_URL": f"sqlite:///{tmp_path / 'env.db'}"}
    assert upgrade("-A", app_module, env=env) == (
        f"sqlite:///{tmp_path / 'env.db'}: schema is up to date\n"
    )
    # VOLTRO_BEAT_CELERY_APP names the app as -A does.
    assert upgrade(env={"VOLTRO_BEAT_STORE_URL": None, "VOLTRO_BEAT_CELERY_APP": app_module}) == (
        f"sqlite:///{tmp_path / 'app.db'}: schema is up to date\n"
    )
    monkeypatch.chdir(tmp_path)
    assert upgrade(env={"VOLTRO_BEAT_STORE_URL": None}) == (
        "sqlite:///voltro-beat.sqlite3: schema is up to date\n"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["preview", "poll"],
        ["status"],
        ["runs"],
        ["claims"],
        ["replicas"],
        ["backfill", "poll", "--since", "1h", "--until", "now"],
        ["run", "poll"],
        ["db", "upgrade"],
        ["db", "check"],
        ["db", "sql"],
        ["admin"],
        ["trigger", "poll"],
        ["serve-trigger"],
        ["config"],
        ["schedules", "ls"],
        ["schedules", "add"],
        ["schedules", "import"],
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_every_command_that_reads_the_app_takes_a_and_app(command: list[str]) -> None:
    out = CliRunner().invoke(main, [*command, "--help"])
    assert out.exit_code == 0, out.output
    assert "-A, --app" in out.output
    assert "VOLTRO_BEAT_CELERY_APP" in out.output


@pytest.mark.parametrize(
    "command",
    [["status"], ["runs"], ["claims"], ["replicas"], ["db", "check"], ["admin", "--no-auth"]],
    ids=" ".join,
)
def test_a_command_that_reads_creates_no_store(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, command, env={"VOLTRO_BEAT_STORE_URL": None})
    assert out.exit_code == 1
    assert "store sqlite:///voltro-beat.sqlite3: no such file" in out.output
    assert list(tmp_path.iterdir()) == []


def test_runs_of_an_unknown_schedule_say_so(app_module: str, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'app.db'}"
    upgrade("--store", store)
    out = CliRunner().invoke(main, ["runs", "--store", store, "--schedule", "nosuch"])
    assert out.exit_code == 1
    assert "no schedule named 'nosuch' in the run table (schedules: none)" in out.output
    with_app = CliRunner().invoke(main, ["runs", "-A", app_module, "--schedule", "nosuch"])
    assert with_app.exit_code == 1
    # Celery's beat adds its cleanup entry to an app without a result backend too.
    assert (
        "nor in the app's beat_schedule (schedules: celery.backend_cleanup, poll)"
        in with_app.output
    )
    # A schedule of the app with no run yet: an empty table, no error.
    known = CliRunner().invoke(main, ["runs", "-A", app_module, "--schedule", "poll"])
    assert known.exit_code == 0, known.output
    assert "(0 newest)" in known.output


def test_version() -> None:
    from importlib.metadata import version

    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0
    assert out.output == f"voltro-beat {version('voltro-beat')}\n"
