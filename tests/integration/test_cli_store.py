"""Which store a ``voltro-beat`` command reads: the app's ``voltro_beat_store_url`` (``-A``),
else ``--store``, else ``VOLTRO_BEAT_STORE_URL`` (SQLite files, through click's runner)."""

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
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_the_apps_store_comes_first(app_module: str, tmp_path: Path) -> None:
    out = CliRunner().invoke(
        main,
        ["db", "upgrade", "-A", app_module, "--store", f"sqlite:///{tmp_path / 'flag.db'}"],
        env={"VOLTRO_BEAT_STORE_URL": f"sqlite:///{tmp_path / 'env.db'}"},
    )
    assert out.exit_code == 0, out.output
    assert out.output == f"sqlite:///{tmp_path / 'app.db'}: schema is up to date\n"


def test_then_the_flag_then_the_environment(tmp_path: Path) -> None:
    env = {"VOLTRO_BEAT_STORE_URL": f"sqlite:///{tmp_path / 'env.db'}"}
    flag = CliRunner().invoke(
        main, ["db", "upgrade", "--store", f"sqlite:///{tmp_path / 'flag.db'}"], env=env
    )
    assert flag.output == f"sqlite:///{tmp_path / 'flag.db'}: schema is up to date\n"
    from_env = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert from_env.output == f"sqlite:///{tmp_path / 'env.db'}: schema is up to date\n"
