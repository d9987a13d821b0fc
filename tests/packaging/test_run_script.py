"""``./run``'s install step, on a stand-in project (the real ``run`` script beside a minimal
pyproject.toml and a demo that only says it ran): the first use shows that it installs, with
pip's own progress, and what it runs next; a second use installs nothing and prints nothing of
its own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "run-script-stand-in"
version = "0"

[tool.setuptools]
py-modules = []

[dependency-groups]
dev = []
"""


def demo(project: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(
        ["./run", "demo"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_first_run_shows_its_install_and_what_comes_next(tmp_path: Path) -> None:
    shutil.copy(ROOT / "run", tmp_path / "run")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "run.py").write_text("print('the demo ran')\n")

    first = demo(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == (
        "run: first use: creating .venv and installing voltro_beat into it (a minute or so)"
    )
    # pip's own progress, not -q.
    assert any(line.startswith("Successfully installed") for line in lines), first.stdout
    assert lines[-2].startswith("run: installed in "), first.stdout
    assert lines[-2].endswith(
        "; now the demo: three beat replicas and a worker for 30 s, then the run table"
    )
    assert lines[-1] == "the demo ran"

    again = demo(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == "the demo ran\n"
