"""The package as an index would publish it: ``python -m build`` makes the sdist and, from it,
the wheel; their metadata is complete (the licence, classifiers, project URLs, a README whose
links work off this repository, no development extra); and the wheel, installed into a clean
venv with only what the package index pip is configured with provides, runs
``voltro-beat --version`` and a ``celery beat -S voltro`` that publishes.
"""

from __future__ import annotations

import email
import email.message
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
#: Where README.md's links point: this tree as the Source URL shows it.
BLOB = PROJECT["urls"]["Source"] + "/blob/main/"

TINY_APP = """\
from celery import Celery

app = Celery("tiny", broker="filesystem://")
app.conf.broker_transport_options = {"data_folder_in": "broker", "data_folder_out": "broker"}
app.conf.beat_schedule = {"tick": {"task": "tiny.tick", "schedule": 1.0}}
"""


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def clean_env() -> dict[str, str]:
    """This environment, without the test venv's or the repository's Python paths."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VOLTRO_", "CELERY_", "PYTHON", "VIRTUAL_ENV"))
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, as README.md says to build them."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], timeout=300)
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob(f"voltro_beat-{VERSION}-py3-none-any.whl")
    return found


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        return email.message_from_bytes(archive.read(f"voltro_beat-{VERSION}.dist-info/METADATA"))


def test_the_licence_is_mit_and_ships_in_both(
    dist: Path, wheel: Path, metadata: email.message.Message
) -> None:
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert f"voltro_beat-{VERSION}.dist-info/licenses/LICENSE" in names
    # The files beat needs at run time.
    assert "voltro_beat/py.typed" in names
    assert any(n.startswith("voltro_beat/store/migrations/versions/") for n in names)
    (sdist,) = dist.glob(f"voltro_beat-{VERSION}.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.partition("/")[2] for m in archive.getmembers()}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members


def test_the_metadata_names_the_project(metadata: email.message.Message) -> None:
    assert metadata["Name"] == "voltro-beat"
    assert metadata["Author"] or metadata["Author-email"]
    classifiers = metadata.get_all("Classifier") or []
    assert {"Framework :: Celery", "Typing :: Typed"} <= set(classifiers)
    assert "Programming Language :: Python :: 3.11" in classifiers
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert urls.keys() >= {"Homepage", "Documentation", "Source", "Issues"}
    assert metadata["Requires-Python"] == ">=3.11"


def test_the_extras_are_the_users_only(metadata: email.message.Message) -> None:
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert extras >= {"postgres", "redis", "solar", "django", "sqladmin", "trigger", "metrics"}
    # The repository's own tools are a dependency group, not published.
    assert "dev" not in extras
    tools = ("ruff", "mypy", "import-linter", "selenium", "mkdocs-material", "build")
    published = [
        re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0] for r in metadata.get_all("Requires-Dist") or []
    ]
    assert not set(tools) & set(published), published


def test_the_readme_s_links_work_on_an_index_page(metadata: email.message.Message) -> None:
    readme = metadata.get_payload()
    assert isinstance(readme, str)
    assert readme.strip() == (ROOT / "README.md").read_text().strip()
    assert metadata["Description-Content-Type"] == "text/markdown"
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets
    for target in targets:
        assert target.startswith(BLOB), f"{target}: not an absolute link into {BLOB}"
        path, _, anchor = target.removeprefix(BLOB).partition("#")
        assert (ROOT / path).is_file(), f"{target}: no {path} in this repository"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{target}: no heading #{anchor} in {path}"


def test_the_wheel_installs_into_a_clean_venv_and_beat_runs(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = clean_env()
    run([sys.executable, "-m", "venv", str(venv)], env=env)
    run(
        [str(venv / "bin" / "pip"), "install", "-q", f"voltro-beat @ {wheel.as_uri()}"],
        env=env,
        timeout=300,
    )
    version = run([str(venv / "bin" / "voltro-beat"), "--version"], env=env, cwd=tmp_path)
    assert version.stdout == f"voltro-beat {VERSION}\n"

    project = tmp_path / "project"
    (project / "broker").mkdir(parents=True)
    (project / "tiny.py").write_text(TINY_APP)
    log = tmp_path / "beat.log"
    with log.open("w") as out:
        beat = subprocess.Popen(
            [str(venv / "bin" / "celery"), "-A", "tiny", "beat", "-S", "voltro", "-l", "info"],
            cwd=project,
            env={**env, "PYTHONPATH": str(project)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not any(b"tiny.tick" in m.read_bytes() for m in (project / "broker").iterdir()):
            assert beat.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        beat.send_signal(signal.SIGTERM)
        code = beat.wait(timeout=30)
    text = log.read_text()
    assert "voltro_beat: store sqlite:///voltro-beat.sqlite3" in text, text[-3000:]
    assert code == 0, text[-3000:]
