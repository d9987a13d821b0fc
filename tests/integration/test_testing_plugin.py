"""The pytest plugin ``voltro_beat.testing``, used the way a user's project uses it: the
example project of docs/testing.md (a Celery app with a ``beat_schedule``, a broker and a store
that do not exist) and its own tests, run by pytest in a subprocess."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def example() -> dict[str, str]:
    """The example project of docs/testing.md: its ``title="..."`` blocks, by file name."""
    found = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```', DOCS.read_text(), flags=re.S | re.M)
    return dict(found)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    files = example()
    assert sorted(files) == ["proj.py", "pytest.ini", "tests/test_schedule.py"]
    for name in ("proj.py", "pytest.ini"):
        (pytester.path / name).write_text(files[name])
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # pytest-celery, if installed, would load itself and want Docker: the user's CI says no.
    return pytester.runpytest_subprocess(
        "-p", "no:celery", "-p", "no:pytest_celery", "-p", "no:cacheprovider", *args
    )


def test_the_documented_example_passes(project: pytest.Pytester) -> None:
    tests = project.path / "tests"
    tests.mkdir()
    (tests / "test_schedule.py").write_text(example()["tests/test_schedule.py"])
    result = run(project)
    result.assert_outcomes(passed=3)


def test_a_wrong_expectation_fails(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_wrong="""
from datetime import datetime, timezone

def test_report_at_two_utc(voltro_tick):
    # Forgot the app's time zone: 02:00 UTC is 03:00 in Paris.
    voltro_tick(datetime(2026, 1, 15, 1, 59, 50, tzinfo=timezone.utc))
    sent = voltro_tick(datetime(2026, 1, 15, 2, 0, 0, tzinfo=timezone.utc))
    assert [m.schedule for m in sent] == ["heartbeat", "nightly-report"]
"""
    )
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Right contains one more item: 'nightly-report'*"])


def test_without_the_app_option_the_fixture_says_what_to_set(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(voltro_occurrences):\n    voltro_occurrences('a')\n")
    result = run(pytester, "-p", "voltro_beat.testing")
    result.stdout.fnmatch_lines(["*set the voltro_beat_app ini option*"])
    assert result.ret != 0


def test_the_tests_store_and_switches_outrank_the_environment(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment outranks the app's settings, the fixture's explicit values outrank
    both: a deployment's variables in the test's shell change nothing."""
    tests = project.path / "tests"
    tests.mkdir()
    (tests / "test_schedule.py").write_text(example()["tests/test_schedule.py"])
    monkeypatch.setenv("VOLTRO_BEAT_STORE_URL", "sqlite:////nonexistent/dir/store.db")
    monkeypatch.setenv("VOLTRO_BEAT_MIGRATE", "false")
    monkeypatch.setenv("VOLTRO_BEAT_METRICS_PORT", "1")  # a port it could not serve
    monkeypatch.setenv("VOLTRO_BEAT_HEALTH_FILE", "/nonexistent/dir/health")
    result = run(project)
    result.assert_outcomes(passed=3)
    assert not Path("/nonexistent").exists()
