"""The statements of beat's firing path written for PostgreSQL by hand.

One statement, one round trip, whatever the batch size: the batch travels as one JSON
parameter (psycopg dumps a text parameter in C, while eight Python lists as arrays cost more
than the statement itself), and data-modifying CTEs make claims + runs + pruning one atomic
statement. SQLite runs the same steps as SQLAlchemy Core statements in one transaction
(:mod:`voltro_beat.store.beat`).
"""

from __future__ import annotations

from voltro_beat.status import Status
from voltro_beat.store.tables import CLAIMS, RUNS

_INPUT = """
WITH input AS (
    SELECT e->>0 AS id, e->>1 AS schedule, e->>2 AS task, e->>3 AS task_id,
           CAST(e->>4 AS timestamptz) AS scheduled_at, e->>5 AS status, e->>6 AS reason,
           CAST(e->>7 AS timestamptz) AS prune_before
    FROM json_array_elements(CAST(:rows AS json)) AS e
)"""

_RUNS_INSERT = f"""
    INSERT INTO {RUNS}
        (id, schedule, task, task_id, scheduled_at, coordination_outcome, status, reason,
         replica, claimed_at)
    SELECT i.id, i.schedule, i.task, i.task_id, i.scheduled_at, :outcome, i.status, i.reason,
           :replica, :now
    FROM input i {{join}}
    ON CONFLICT DO NOTHING
    RETURNING id"""

#: Claims, then run rows for the claims that went in, then the winner's pruning of its
#: schedules' older claims; returns the keys won. Parameters: rows (JSON), now, replica,
#: outcome.
CLAIM = (
    _INPUT
    + f""",
gated AS (
    INSERT INTO {CLAIMS} (id, schedule, scheduled_at, claimed_at, replica)
    SELECT id, schedule, scheduled_at, :now, :replica FROM input
    ON CONFLICT DO NOTHING
    RETURNING id
),
recorded AS ("""
    + _RUNS_INSERT.format(join="JOIN gated g ON g.id = i.id")
    + f"""
),
pruned AS (
    DELETE FROM {CLAIMS} c
    USING recorded r JOIN input i ON i.id = r.id
    WHERE c.schedule = i.schedule AND c.scheduled_at < i.prune_before
)
SELECT id FROM recorded"""
)

#: Run rows only (``single`` coordination); returns the keys recorded.
RECORD = (
    _INPUT
    + """,
recorded AS ("""
    + _RUNS_INSERT.format(join="")
    + """
)
SELECT id FROM recorded"""
)

#: Stamp the publish time of the runs in ``keys`` (a JSON list). The worker may already have
#: moved a row on (started, even succeeded): only a ``claimed`` row becomes ``published``.
MARK_PUBLISHED = f"""
UPDATE {RUNS} AS r
SET published_at = :now,
    status = CASE WHEN r.status = '{Status.CLAIMED}' THEN '{Status.PUBLISHED}' ELSE r.status END
FROM json_array_elements_text(CAST(:keys AS json)) AS k(id)
WHERE r.id = k.id"""
