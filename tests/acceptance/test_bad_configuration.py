"""A bad configuration stops ``celery beat -S voltro`` at boot, before anything is published,
with exit code 78 and one block on the log that names the entry or the setting to fix; the
traceback only at ``--loglevel debug``.

Each case also carries a valid every-second entry, so a beat that got past boot would leave
run rows and messages behind within a second. The cases are independent (a database and a
queue each) and run side by side: a beat process spends seconds just importing.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from vbt_harness import (
    EVERY_SECOND,
    REDIS_URL,
    ROOT,
    Deployment,
    ProcessSet,
    Sched,
    fresh_database,
    read_runs,
    sqlalchemy_url,
)

LONG_NAME = "n" * 201


@dataclass(frozen=True)
class Case:
    #: The bad entry, if the case is about an entry.
    entry: Sched | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: ``"typo"``: the store URL with a misspelt dialect.
    store: str = "postgresql"
    #: Every one of these must appear in beat's output.
    says: tuple[str, ...] = ()
    #: Beat's ``--loglevel``: only ``debug`` shows the traceback.
    loglevel: str = "info"


CASES = {
    "unparsable-cron": Case(Sched("bad-cron", '"61 * * * *"'), says=("'bad-cron'", "schedule")),
    "unknown-tz": Case(
        Sched("bad-tz", '"0 * * * *"', {"tz": '"Mars/Olympus_Mons"'}),
        says=("'bad-tz'", "'tz'", "Mars/Olympus_Mons"),
    ),
    "zero-interval": Case(
        Sched("zero-interval", "timedelta(0)"), says=("'zero-interval'", "schedule", "positive")
    ),
    "negative-interval": Case(
        Sched("negative-interval", "-5"), says=("'negative-interval'", "schedule", "positive")
    ),
    "sub-millisecond-interval": Case(
        Sched("sub-ms", "timedelta(microseconds=1500)"),
        says=("'sub-ms'", "schedule", "milliseconds"),
    ),
    "name-with-at": Case(Sched("bad@name", '"* * * * *"'), says=("'bad@name'", "'@'")),
    "name-too-long": Case(Sched(LONG_NAME, '"* * * * *"'), says=(LONG_NAME, "201 characters")),
    "unknown-schedule-type": Case(
        Sched("bad-type", '{"every": 5}'), says=("'bad-type'", "unknown schedule type")
    ),
    "naive-clocked-datetime": Case(
        Sched("naive-once", "datetime(2030, 1, 1, 12, 0)"), says=("'naive-once'", "naive")
    ),
    "unknown-trigger": Case(
        Sched("bad-trigger", '"0 * * * *"', {"trigger": '"cronjob"'}),
        says=("'bad-trigger'", "'trigger'", "'cronjob'"),
    ),
    "unknown-coordination": Case(
        settings={"voltro_beat_coordination": "leader"},
        says=("voltro_beat_coordination", "'leader'"),
    ),
    "store-dialect-typo": Case(store="typo", says=("voltro_beat_store_url", "postgresq+psycopg")),
    "singleton-without-cluster": Case(
        settings={"voltro_beat_singletons": {"inbox": {"run": "vbt_proj:write_token"}}},
        says=("voltro_beat_coordination", "inbox", "'cluster'"),
    ),
    "singleton-that-does-not-import": Case(
        settings={
            "voltro_beat_coordination": "cluster",
            "voltro_beat_singletons": {"inbox": {"run": "vbt_nowhere:poll"}},
        },
        says=("singleton 'inbox', field 'run'", "vbt_nowhere:poll"),
    ),
    "unparsable-cron-at-debug": Case(
        Sched("bad-cron", '"61 * * * *"'),
        says=("'bad-cron'", "Traceback (most recent call last)", "ConfigurationError"),
        loglevel="debug",
    ),
}
#: The block beat logs, around the error's own message.
BLOCK = (
    "CRITICAL/MainProcess] voltro_beat: beat did not start: the configuration is invalid.\n"
    "    ConfigurationError: ",
    "    Fix the entry or setting it names; run beat with --loglevel debug for the traceback.",
)


@dataclass(frozen=True)
class Result:
    code: int | None
    output: str
    queued: int
    executions: int
    runs: int


@pytest.fixture(scope="module")
def results(need: Callable[..., None]) -> Iterator[dict[str, Result]]:
    """Run ``celery beat -S voltro`` once per case, all at once; what each one left behind."""
    need("postgresql", "redis")
    root = Path(tempfile.mkdtemp(prefix="vbt-acc-config-"))
    procs = ProcessSet()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        try:
            deps = {name: _launch(stack, root / name, procs, case) for name, case in CASES.items()}
            yield {name: _result(dep, CASES[name]) for name, dep in deps.items()}
        finally:
            procs.close()


def _launch(
    stack: contextlib.ExitStack, workdir: Path, procs: ProcessSet, case: Case
) -> Deployment:
    workdir.mkdir()
    db = stack.enter_context(fresh_database())
    store_url = sqlalchemy_url(db)
    if case.store == "typo":
        store_url = store_url.replace("postgresql+", "postgresq+", 1)
    dep = Deployment(
        workdir,
        procs,
        store_url=store_url,
        broker_url=REDIS_URL,
        exec_dsn=db,
        loglevel=case.loglevel,
    )
    stack.callback(dep.delete_queue)
    dep.create_executions_table()
    dep.configure(
        [EVERY_SECOND] if case.entry is None else [EVERY_SECOND, case.entry], **case.settings
    )
    dep.start_beats("r1")
    return dep


def _result(dep: Deployment, case: Case) -> Result:
    beat = dep.beats["r1"]
    try:
        code: int | None = beat.popen.wait(timeout=90)
    except subprocess.TimeoutExpired:
        code = None
    beat.stop()
    return Result(
        code=code,
        output=beat.text(),
        queued=dep.queue_length(),
        executions=len(dep.executions()),
        runs=len(read_runs(sqlalchemy_url(dep.exec_dsn))),
    )


@pytest.mark.parametrize("name", list(CASES))
def test_bad_configuration_exits_at_boot_naming_the_culprit(
    results: dict[str, Result], name: str
) -> None:
    result, case = results[name], CASES[name]
    tail = "\n".join(result.output.splitlines()[-25:])
    assert result.code is not None, f"beat did not exit at boot:\n{tail}"
    assert result.code == 78, tail
    missing = [s for s in case.says if s not in result.output]
    assert not missing, f"beat's output does not name {missing}:\n{tail}"
    assert all(part in result.output for part in BLOCK), tail
    assert result.output.count("CRITICAL") == 1, tail
    if case.loglevel != "debug":
        assert "Traceback" not in result.output, tail
    assert "Sent due task" not in result.output, tail
    assert (result.queued, result.executions, result.runs) == (0, 0, 0)


def test_the_operations_page_shows_what_beat_prints(results: dict[str, Result]) -> None:
    """docs/operations.md's example is the unparsable-cron case's block, timestamp aside."""
    page = (ROOT / "docs" / "operations.md").read_text()
    shown = re.search(r"A bad entry looks like this.*?```text\n(.*?)```", page, flags=re.S)
    assert shown, "docs/operations.md has no example of a bad entry"

    def block(text: str) -> str:
        start = text.index("CRITICAL/MainProcess]")
        return text[start : text.index("traceback.", start) + len("traceback.")]

    assert block(shown.group(1)) == block(results["unparsable-cron"].output)
