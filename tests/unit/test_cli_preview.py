"""``voltro-beat preview``: the next instants of a schedule, local and UTC, with their keys."""

from __future__ import annotations

import doctest
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from voltro_beat.cli import main

DOCS = Path(__file__).parents[2] / "docs" / "schedules.md"


def preview(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["preview", *args])
    return result.exit_code, result.output


def rows(output: str) -> list[list[str]]:
    """The table's data rows, as cells."""
    return [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in output.splitlines()
        if re.match(r"│\s*\d+\s*│", line)
    ]


def test_spring_forward_in_berlin() -> None:
    code, output = preview(
        "30 2 * * *", "--tz", "Europe/Berlin", "-n", "3", "--after", "2024-03-30T00:00:00Z"
    )
    assert code == 0, output
    assert rows(output) == [
        ["1", "2024-03-30 02:30:00 CET", "2024-03-30 01:30:00", "preview@2024-03-30T01:30:00"],
        ["2", "2024-03-31 03:00:00 CEST", "2024-03-31 01:00:00", "preview@2024-03-31T01:00:00"],
        ["3", "2024-04-01 02:30:00 CEST", "2024-04-01 00:30:00", "preview@2024-04-01T00:30:00"],
    ]


def test_seconds_through_the_repeated_hour_with_a_name_and_a_naive_after() -> None:
    # A naive --after is read in --tz: 01:59:40 on the first pass (EDT).
    code, output = preview(
        "*/10 * * * * *",
        "--tz",
        "America/New_York",
        "-n",
        "4",
        "--name",
        "tick",
        "--after",
        "2024-11-03T01:59:30",
    )
    assert code == 0, output
    assert [row[1:] for row in rows(output)] == [
        ["2024-11-03 01:59:40 EDT", "2024-11-03 05:59:40", "tick@2024-11-03T05:59:40"],
        ["2024-11-03 01:59:50 EDT", "2024-11-03 05:59:50", "tick@2024-11-03T05:59:50"],
        ["2024-11-03 01:00:00 EST", "2024-11-03 06:00:00", "tick@2024-11-03T06:00:00"],
        ["2024-11-03 01:00:10 EST", "2024-11-03 06:00:10", "tick@2024-11-03T06:00:10"],
    ]


def test_sub_second_interval() -> None:
    code, output = preview("0.25", "-n", "2", "--after", "2024-01-01T00:00:00+00:00")
    assert code == 0, output
    assert [row[-1] for row in rows(output)] == [
        "preview@2024-01-01T00:00:00.250",
        "preview@2024-01-01T00:00:00.500",
    ]


def test_defaults_to_ten_instants_from_now() -> None:
    code, output = preview("@hourly")
    assert code == 0, output
    assert len(rows(output)) == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["61 * * * *"],
            "schedule 'preview', field 'schedule': cron expression '61 * * * *': minute 61 in "
            "'61' is out of range (0-59)",
        ),
        (["* * *"], "schedule 'preview', field 'schedule'"),
        (["0"], "schedule 'preview', field 'schedule': the interval must be positive"),
        (["0 * * * *", "--tz", "Mars/Olympus"], "schedule 'preview', field 'tz'"),
        (["0 * * * *", "--name", "a@b"], "schedule 'a@b', field 'name'"),
        (["0 * * * *", "--after", "yesterday"], "'after': 'yesterday' is not an ISO 8601 datetime"),
        (["0 * * * *", "-n", "0"], "Invalid value for '-n'"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], message: str) -> None:
    code, output = preview(*args)
    assert code == 2
    assert message in output


def test_preview_is_a_subcommand_of_the_group() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "preview" in result.output


def documented_commands() -> list[tuple[str, list[str]]]:
    """Each ``$ voltro-beat ...`` line of the docs with the lines shown after it."""
    commands: list[tuple[str, list[str]]] = []
    shown: list[str] | None = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("$ voltro-beat "):
            shown = []
            commands.append((line.removeprefix("$ "), shown))
        elif line.startswith("```"):
            shown = None
        elif shown is not None:
            shown.append(line)
    return commands


def test_docs_have_commands() -> None:
    assert len(documented_commands()) >= 5


@pytest.mark.parametrize(("command", "shown"), documented_commands())
def test_documented_commands_work(command: str, shown: list[str]) -> None:
    result = CliRunner().invoke(main, shlex.split(command)[1:])
    if shown and shown[0].startswith("Error: "):
        assert result.exit_code == 2
        assert shown[0] in result.output
    else:
        assert result.exit_code == 0, result.output
        assert rows(result.output) == rows("\n".join(shown))


def test_documented_python_examples_work() -> None:
    failures, tried = doctest.testfile(
        str(DOCS), module_relative=False, optionflags=doctest.ELLIPSIS
    )
    assert tried > 0
    assert failures == 0


def test_with_the_app_an_entry_name_previews_that_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "preview_app_proj.py").write_text(
        "from celery import Celery\n"
        "app = Celery('preview_app_proj')\n"
        "app.conf.timezone = 'Europe/Berlin'\n"
        "app.conf.beat_schedule = {\n"
        "    'nightly': {'task': 't', 'schedule': '30 2 * * *'},\n"
        "    'zoned': {'task': 't', 'schedule': '0 9 * * *', 'tz': 'America/New_York'},\n"
        "}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    after = ["--after", "2026-03-28T00:00:00Z", "-n", "2"]
    code, out = preview("nightly", "-A", "preview_app_proj", *after)
    assert code == 0, out
    # The app's zone: 02:30 in Berlin; on the 29th the clocks skip it (the first instant after).
    assert [r[3] for r in rows(out)] == [
        "nightly@2026-03-28T01:30:00",
        "nightly@2026-03-29T01:00:00",
    ]
    code, out = preview("zoned", "--app", "preview_app_proj:app", *after)
    assert code == 0, out
    assert "local (America/New_York)" in out
    assert rows(out)[0][1] == "2026-03-28 09:00:00 EDT"
    # Not an entry: an expression, in the app's time zone.
    code, out = preview("0 12 * * *", "-A", "preview_app_proj", *after)
    assert code == 0, out
    assert rows(out)[0][1:3] == ["2026-03-28 12:00:00 CET", "2026-03-28 11:00:00"]
