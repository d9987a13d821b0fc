"""The operator's ``voltro-beat`` commands, run as real subprocesses against a store that three
real beat replicas and a worker are filling (PostgreSQL, Redis): ``status``, ``runs --json``,
``claims``, ``backfill`` (twice over one window: each occurrence runs once on the worker),
``run``, ``db check``, and each error as one line and exit code 1."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from vbt_harness import (
    EVERY_2S,
    EVERY_SECOND,
    REPLICAS,
    Deployment,
    Deployments,
    Sched,
    free_port,
    now,
    wait_until,
)

from voltro_beat.occurrences import occurrence_key, occurrences_between, task_id_for

VOLTRO_BEAT = str(Path(sys.executable).with_name("voltro-beat"))
HOURLY = Sched("hourly", '"0 * * * *"')
SCHEDULES = [EVERY_SECOND, EVERY_2S, HOURLY]


@dataclass(frozen=True)
class Scenario:
    dep: Deployment
    #: When the replicas were started: nothing of the schedules before it was fired by beat.
    booted: datetime


def cli(
    dep: Deployment, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VOLTRO_BEAT, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env or dep.env()),
        cwd=dep.workdir,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error's single line (asserting exit code 1, nothing else on stderr, no traceback)."""
    assert result.returncode == 1, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def scenario(module_deployment: Deployments) -> Scenario:
    dep = module_deployment(store="postgresql", broker="redis", app="vbt_ops_proj")
    dep.configure(SCHEDULES)
    dep.start_worker()
    booted = now()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    # A few occurrences of each sub-minute schedule, run and recorded by the worker.
    assert wait_until(
        lambda: sum(r.status == "succeeded" for r in dep.runs().values()) >= 6, timeout=30
    ), "the worker recorded nothing"
    return Scenario(dep, booted)


def test_status_shows_each_schedule_and_the_replicas(scenario: Scenario) -> None:
    out = ok(cli(scenario.dep, "status", "-A", "vbt_ops_proj"))
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    for sched in SCHEDULES:
        assert sched.name in lines, out
    # The sub-second schedules have run: a last run, a success rate and a lag.
    for sched in (EVERY_SECOND, EVERY_2S):
        cells = [c.strip() for c in lines[sched.name].split("│")[1:-1]]
        _, upcoming, last, status, success, rows, lag, outcomes = cells
        assert datetime.fromisoformat(upcoming) > datetime.fromisoformat(last), cells
        assert status in {"claimed", "published", "started", "succeeded"}, cells
        assert success.endswith("%") and float(lag) >= 0 and int(rows) > 0, cells
        assert "succeeded" in outcomes, cells
    assert "replicas: 3 live of 3 registered" in out, out
    for name in REPLICAS:
        assert f"  {name} (" in out


def test_runs_json_parses_back_to_the_run_rows(scenario: Scenario) -> None:
    dep = scenario.dep
    since = scenario.booted.replace(microsecond=0).isoformat()
    out = ok(
        cli(dep, "runs", "--json", "--since", since, "--schedule", EVERY_SECOND.name, "-n", "10000")
    )
    rows = [json.loads(line) for line in out.splitlines()]
    stored = dep.runs()
    assert rows and all(r["schedule"] == EVERY_SECOND.name for r in rows)
    for row in rows:
        run = stored[row["id"]]
        assert row["task_id"] == run.task_id == task_id_for(row["id"])
        assert datetime.fromisoformat(row["scheduled_at"]) == run.scheduled_at
        assert datetime.fromisoformat(row["scheduled_at"]) >= scenario.booted.replace(microsecond=0)
        if row["published_at"] is not None:
            published = datetime.fromisoformat(row["published_at"])
            assert row["lag"] == pytest.approx((published - run.scheduled_at).total_seconds())
    # Newest first, and --until excludes its instant.
    assert [r["scheduled_at"] for r in rows] == sorted(
        (r["scheduled_at"] for r in rows), reverse=True
    )
    until = rows[0]["scheduled_at"]
    older = [
        json.loads(line)
        for line in ok(
            cli(dep, "runs", "--json", "--until", until, "--schedule", EVERY_SECOND.name)
        ).splitlines()
    ]
    assert older and all(r["scheduled_at"] < until for r in older)
    # The table has the lag column.
    assert "lag s" in ok(cli(dep, "runs", "-n", "3"))


def test_claims_counts_per_replica(scenario: Scenario) -> None:
    out = ok(cli(scenario.dep, "claims", "-n", "5"))
    per_replica = out.split("claims per replica:")[1].splitlines()[1:]
    counts = {line.split(":")[0].strip(): int(line.split(":")[1]) for line in per_replica}
    assert set(counts) <= set(REPLICAS) and len(counts) > 1, out


def test_backfill_twice_publishes_each_occurrence_once(scenario: Scenario) -> None:
    dep = scenario.dep
    # A window before the replicas booted: beat never fires history on a first boot.
    end = scenario.booted.replace(microsecond=0) - timedelta(seconds=30)
    start = end - timedelta(seconds=40)
    spec = EVERY_2S.entry().spec
    keys = [occurrence_key(EVERY_2S.name, at) for at in occurrences_between(spec, start, end)]
    assert len(keys) == 20
    window = ["--since", start.isoformat(), "--until", end.isoformat()]

    dry = ok(cli(dep, "backfill", EVERY_2S.name, *window, "--dry-run", "-A", "vbt_ops_proj"))
    assert dry.splitlines()[1:] == keys, dry
    assert not set(keys) & set(dep.runs()), "--dry-run recorded something"

    first = ok(cli(dep, "backfill", EVERY_2S.name, *window, "--yes", "-A", "vbt_ops_proj"))
    assert f"{EVERY_2S.name}: published 20" in first, first
    second = ok(cli(dep, "backfill", EVERY_2S.name, *window, "--yes", "-A", "vbt_ops_proj"))
    assert "20 already recorded, 0 to publish" in second, second

    assert wait_until(lambda: set(keys) <= {e.occurrence for e in dep.executions()}, timeout=30)
    executed = [e.occurrence for e in dep.executions() if e.occurrence in set(keys)]
    assert sorted(executed) == sorted(keys), "each backfilled occurrence runs exactly once"
    runs = dep.runs()
    assert {runs[k].reason for k in keys} == {"backfill"}
    assert {runs[k].coordination_outcome for k in keys} == {"won_lock"}


def test_run_publishes_one_occurrence_on_the_grid(scenario: Scenario) -> None:
    dep = scenario.dep
    # An hour before boot, plus some: snapped back to that hour's start, which beat never fired.
    at = scenario.booted - timedelta(hours=1, minutes=1)
    key = occurrence_key(HOURLY.name, at.replace(minute=0, second=0, microsecond=0))
    out = ok(cli(dep, "run", HOURLY.name, "--at", at.isoformat(), "-A", "vbt_ops_proj"))
    assert out.strip() == f"{key}: published, task id {task_id_for(key)}"
    assert wait_until(lambda: key in {e.occurrence for e in dep.executions()}, timeout=30)
    assert dep.runs()[key].reason == "manual"

    again = one_line_error(
        cli(dep, "run", HOURLY.name, "--at", at.isoformat(), "-A", "vbt_ops_proj")
    )
    assert again.startswith(f"Error: {key}: already recorded"), again
    assert [e.occurrence for e in dep.executions()].count(key) == 1
    # A few seconds ago, on a one-second grid: an occurrence the replicas fired already.
    past = (now() - timedelta(seconds=3)).isoformat()
    busy = one_line_error(cli(dep, "run", EVERY_SECOND.name, "--at", past, "-A", "vbt_ops_proj"))
    assert "already recorded" in busy

    # Now: this hour's start, which the replicas fired themselves only if they booted before it.
    hour = now().replace(minute=0, second=0, microsecond=0)
    this_hour = occurrence_key(HOURLY.name, hour)
    result = cli(dep, "run", HOURLY.name, "-A", "vbt_ops_proj")
    if scenario.booted >= hour:
        assert ok(result).startswith(f"{this_hour}: published")
        assert dep.runs()[this_hour].reason == "manual"
    else:
        assert one_line_error(result).startswith(f"Error: {this_hour}: already recorded")


def test_db_check(scenario: Scenario, tmp_path: Path) -> None:
    out = ok(cli(scenario.dep, "db", "check"))
    assert "(current)" in out and out.count(": readable") == 3, out
    sqlite3.connect(tmp_path / "empty.db").close()
    empty = cli(
        scenario.dep, "db", "check", "--store", f"sqlite:///{tmp_path / 'empty.db'}", env={}
    )
    assert empty.returncode == 1 and "run `voltro-beat db upgrade`" in empty.stdout
    # A file that is not there is not created by a check.
    missing = cli(
        scenario.dep, "db", "check", "--store", f"sqlite:///{tmp_path / 'missing.db'}", env={}
    )
    assert "no such file" in one_line_error(missing)
    assert not (tmp_path / "missing.db").exists()


def test_errors_are_one_line_and_exit_1(scenario: Scenario, tmp_path: Path) -> None:
    dep = scenario.dep
    bare = {k: v for k, v in dep.env().items() if k != "VOLTRO_BEAT_STORE_URL"}
    sqlite3.connect(tmp_path / "new.db").close()
    ahead = (now() + timedelta(hours=2)).isoformat()
    cases = {
        "store unreachable": (
            ["runs", "--store", f"postgresql://root@127.0.0.1:{free_port()}/nothing"],
            "connection",
        ),
        "tables missing": (
            ["status", "--store", f"sqlite:///{tmp_path / 'new.db'}"],
            "run `voltro-beat db upgrade`",
        ),
        "unknown schedule": (
            [
                "backfill",
                "nope",
                "--since",
                "1h",
                "--until",
                "now",
                "-A",
                "vbt_ops_proj",
                "--store",
                dep.store_url,
            ],
            "unknown schedule 'nope'",
        ),
        "bad time format": (
            ["runs", "--since", "yesterday-ish", "--store", dep.store_url],
            "--since: 'yesterday-ish' is not an ISO 8601 instant",
        ),
        "app not importable": (
            ["status", "-A", "no_such_module_here"],
            "cannot import the Celery app 'no_such_module_here'",
        ),
        # Occurrences still to come are beat's: never published early by hand.
        "backfill into the future": (
            [
                "backfill",
                EVERY_2S.name,
                "--since",
                "1m",
                "--until",
                ahead,
                "-A",
                "vbt_ops_proj",
                "--store",
                dep.store_url,
            ],
            "--until " + ahead,
        ),
        "run in the future": (
            ["run", HOURLY.name, "--at", ahead, "-A", "vbt_ops_proj", "--store", dep.store_url],
            "is ahead of the database's clock",
        ),
    }
    for what, (args, expected) in cases.items():
        line = one_line_error(cli(dep, *args, env=bare))
        assert expected in line, f"{what}: {line}"
