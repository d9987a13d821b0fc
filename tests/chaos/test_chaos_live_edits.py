"""Edits of the schedules table every 100 ms while a replica is killed (-9) and restarted:
nothing executed twice, nothing lost, every run fired by a definition live at its instant.

Thirty schedules of the table, edited in turn one every 100 ms (each one every three seconds):
its cron string changes among every second, every two and every three seconds, and every
fourth edit of a schedule disables it (the next one enables it again). Four seconds in, the
replica r2 is SIGKILLed; four seconds later it starts again. Owed are each
definition's instants from one second after its commit to the next change
(``vbt_harness.table_keys``); a run claimed ahead of a change may fire the definition it was
claimed under (docs/schedule-table.md).
"""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

from chaos_harness import ChaosDeployments, Results, boot, tally
from vbt_harness import (
    EVERY_SECOND,
    REPLICAS,
    TASK,
    Outcome,
    check,
    now,
    problems_revisions,
    read_changes,
    read_revisions,
    sleep_until,
    start_private_redis,
    table_keys,
    window_start,
)

from voltro_beat.config import Settings
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.store.database import Database

NAMES = [f"edited-{i:02}" for i in range(30)]
CRONS = ["* * * * * *", "*/2 * * * * *", "*/3 * * * * *"]
EVERY = timedelta(milliseconds=100)


def test_edits_every_100ms_while_a_replica_is_killed_and_restarted(
    chaos: ChaosDeployments, chaos_results: Results
) -> None:
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    boot(dep, [EVERY_SECOND], REPLICAS)
    database = Database.open(dep.store_url)
    table = ScheduleTable(database, Settings.resolve({}, environ={}))
    rows = {name: table.add(name, {"task": TASK, "schedule": CRONS[0]}) for name in NAMES}
    stop = threading.Event()
    edits: list[int] = []
    failures: list[BaseException] = []

    def edit() -> None:
        try:
            for n in itertools.count():
                if stop.wait(EVERY.total_seconds()):
                    return
                name = NAMES[n % len(NAMES)]
                round_ = n // len(NAMES)
                current = rows[name]
                if not current.enabled:
                    rows[name] = table.enable(name, revision=current.revision, by="chaos")
                elif round_ % 4 == 3:
                    rows[name] = table.disable(name, revision=current.revision, by="chaos")
                else:
                    definition = {"task": TASK, "schedule": CRONS[round_ % len(CRONS)]}
                    rows[name] = table.set(name, definition, revision=current.revision, by="c")
                edits.append(n)
        except BaseException as exc:  # reported below
            failures.append(exc)

    editor = threading.Thread(target=edit, daemon=True)
    start = window_start()
    editor.start()
    sleep_until(start + timedelta(seconds=4))
    victim = "r2"
    dep.beats[victim].kill9()
    killed = now()
    sleep_until(killed + timedelta(seconds=4))
    dep.start_beats(victim)
    restarted = now()
    end = restarted + timedelta(seconds=8)
    sleep_until(end)
    stop.set()
    editor.join(timeout=10)
    assert failures == [], failures
    sleep_until(end + timedelta(seconds=1.5))
    dep.stop_beats()

    changes = read_changes(dep.store_url)
    keys = [k for name in NAMES for k in table_keys(name, changes[name], end) if k]
    keys = [k for k in keys if k.rpartition("@")[2] >= f"{start:%Y-%m-%dT%H:%M:%S}"]
    dep.drain(keys)
    outcome = Outcome(keys, dep.runs(), dep.executions())
    row = tally(
        "11. edits of the schedules table every 100 ms, a replica killed -9 and restarted", outcome
    )
    revisions = read_revisions(dep.store_url)
    for name in NAMES:
        row.problems += problems_revisions(name, changes[name], outcome.runs, revisions)
    row.notes += [
        f"{len(edits)} edits of {len(NAMES)} schedules in {(end - start).total_seconds():.0f}s"
        f" (revision {max(r.revision for r in rows.values())}); {victim} killed -9 at"
        f" +{(killed - start).total_seconds():.1f}s, started again at"
        f" +{(restarted - start).total_seconds():.1f}s",
        "runs fired by the definition live at their instant or at their claim: checked for"
        f" {sum(1 for r in outcome.runs.values() if r.schedule in NAMES)} run rows",
    ]
    chaos_results.add(row)
    database.dispose()
    check(row.problems, f"{victim} killed at {killed:%T.%f}, restarted at {restarted:%T.%f}")
