"""docs/quickstart.md, run as written: every ``sh`` block, in order, and its files (the
``title="..."`` code blocks), and what each step prints.

The first part (the README's commands) runs in the repository; the project part runs in an
empty directory as one shell session, the way a reader pastes it into one terminal, with the
broker on a Redis database of its own. ``./run test`` is the command that runs this test, so it
is checked to be CI's command (.ci/run) instead of being run again.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
PROJECT_HEADING = "## Your own project in five steps"
#: A Redis database no other test uses, emptied before and after.
BROKER_DB = 11

pytestmark = pytest.mark.redis


def blocks(text: str) -> list[tuple[str, str]]:
    """``(info string, body)`` of every fenced code block."""
    return re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.S | re.M)


def parts() -> tuple[list[str], list[tuple[str, str]]]:
    """The shell commands of the repository part, and the blocks of the project part."""
    text = QUICKSTART.read_text()
    repository, _, project = text.partition(PROJECT_HEADING)
    assert project, f"{QUICKSTART} has no {PROJECT_HEADING!r}"
    commands = [
        line for info, body in blocks(repository) if info == "sh" for line in body.splitlines()
    ]
    return commands, blocks(project)


def test_the_readme_commands_are_the_quickstart_s_and_the_demo_runs_each_occurrence_once() -> None:
    commands, _ = parts()
    assert commands == ["./run demo", "./run test"]
    readme = (ROOT / "README.md").read_text()
    assert all(f"{command}   " in readme or f"{command} " in readme for command in commands)
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("./run test")

    demo = subprocess.run(
        ["./run", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    summary = re.compile(r"^(\d+) occurrences; won by (.*); executed more than once: 0$", re.M)
    ran = summary.search(demo.stdout)
    assert ran, demo.stdout[-3000:]
    # The page's sample line is a run's: the same replicas, counts that add up, and about as
    # many occurrences as this run's (the demo's schedules fire the same number each run,
    # give or take the boundaries of its window).
    shown = summary.search(QUICKSTART.read_text())
    assert shown, f"{QUICKSTART} shows no summary line of the demo"
    wins = dict(re.findall(r"(\S+): (\d+)", shown[2]))
    assert wins.keys() == dict(re.findall(r"(\S+): (\d+)", ran[2])).keys()
    assert sum(map(int, wins.values())) == int(shown[1])
    assert abs(int(shown[1]) - int(ran[1])) <= 0.2 * int(ran[1]), (shown[0], ran[0])


def test_the_five_steps_run_a_worker_and_two_replicas_that_record_every_run(
    tmp_path: Path, redis_url: str
) -> None:
    _, project = parts()
    script = ["set -e"]
    for info, body in project:
        title = re.search(r'title="([^"]+)"', info)
        if title:
            (tmp_path / title.group(1)).write_text(body)
        elif info == "sh":
            script.append(body)
    assert (tmp_path / "proj.py").exists()

    broker = f"{redis_url}/{BROKER_DB}"
    redis.Redis.from_url(broker).flushdb()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CELERY_BROKER_URL": broker,
        # The project is installed in this venv already: pip must not look further.
        "PIP_NO_INDEX": "1",
        "COLUMNS": "200",
    }
    env = {k: v for k, v in env.items() if not k.startswith(("VOLTRO_", "PYTHONPATH"))}
    session = subprocess.Popen(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = session.communicate(timeout=180)
    finally:
        with_logs = "\n".join(
            f"--- {log.name}\n{log.read_text()[-2000:]}" for log in tmp_path.glob("*.log")
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session.pid, signal.SIGKILL)
        redis.Redis.from_url(broker).flushdb()
    assert session.returncode == 0, output[-4000:] + with_logs

    assert "sqlite:///voltro-beat.sqlite3: schema is up to date" in output
    runs = re.findall(r"│ (hello@\S+) +│ (\w+) +│ [^│]*│ (\S+) +│ won_lock ", output)
    assert len(runs) == 4, output
    assert "succeeded" in {status for _, status, _ in runs}, output
    replicas = dict(re.findall(r"^│ (\S+:\d+) +│.*│ (yes|no) +│", output, flags=re.M))
    assert list(replicas.values()) == ["yes", "yes"], output
    assert {replica for _, _, replica in runs} <= replicas.keys()
    # What the page shows is what this run printed: the same lines, the same columns.
    shown = [body for info, body in parts()[1] if info == "text"]
    assert shown[0].strip() in output
    for title in ("_voltro_schedule_runs (4 newest)", "_voltro_beat_replicas (2)"):
        assert headers(shown[1], title) == headers(output, title)[: len(headers(shown[1], title))]


def headers(text: str, title: str) -> list[str]:
    """The column names of the table titled ``title`` in ``text``, up to an elided one."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == title)
    row = next(line for line in lines[at + 1 :] if line.startswith("┃"))
    names = [cell.strip() for cell in row.strip("┃").split("┃")]
    return list(itertools.takewhile(lambda name: "…" not in name, names))
