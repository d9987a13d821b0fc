"""The statements of beat's firing path written for PostgreSQL by hand.

One statement, one round trip, whatever the batch size: the batch travels as one JSON
parameter (psycopg dumps a text parameter in C, while Python lists as arrays cost more than
the statement itself), and data-modifying CTEs make claims + runs + pruning one atomic
statement. Every instant a lease or a deadline is compared with is ``clock_timestamp()``: the
database's clock when the statement runs, never a value a replica computed before a pause
(guarantees 9 and 10). SQLite runs the same steps as SQLAlchemy Core statements
(:mod:`voltro_beat.store.beat`).
"""

from __future__ import annotations

from voltro_beat.status import Status
from voltro_beat.store.tables import CLAIMS, RUNS, WATERMARKS

_CLAIMED = f"'{Status.CLAIMED}'"
_PUBLISHED = f"'{Status.PUBLISHED}'"

_INPUT = f"""
WITH input AS (
    SELECT e->>0 AS id, e->>1 AS schedule, e->>2 AS task, e->>3 AS task_id,
           CAST(e->>4 AS timestamptz) AS scheduled_at, e->>5 AS status, e->>6 AS reason,
           CAST(e->>7 AS timestamptz) AS prune_before, CAST(e->>8 AS timestamptz) AS deadline
    FROM json_array_elements(CAST(:rows AS json)) AS e
    -- Older than a run row the retention swept: refused (BeatStore.delete_expired).
    WHERE CAST(e->>4 AS timestamptz) >= COALESCE(
        (SELECT w.before FROM {WATERMARKS} w WHERE w.name = '{RUNS}'), '-infinity')
)"""

# A claimed row's lease runs from its instant (claimed ahead) or from now (claimed late).
_RUNS_INSERT = f"""
    INSERT INTO {RUNS}
        (id, schedule, task, task_id, scheduled_at, coordination_outcome, status, reason,
         replica, claimed_at, deadline, lease_until)
    SELECT i.id, i.schedule, i.task, i.task_id, i.scheduled_at, :outcome, i.status, i.reason,
           :replica, clock_timestamp(), i.deadline,
           CASE WHEN i.status = {_CLAIMED}
                THEN GREATEST(i.scheduled_at, clock_timestamp()) + make_interval(secs => :lease)
           END
    FROM input i {{join}}
    ON CONFLICT DO NOTHING
    RETURNING id"""

#: Claims, then run rows for the claims that went in, then the winner's pruning of its
#: schedules' older claims; returns the keys won. Parameters: rows (JSON), replica, outcome,
#: lease (seconds).
CLAIM = (
    _INPUT
    + f""",
gated AS (
    INSERT INTO {CLAIMS} (id, schedule, scheduled_at, claimed_at, replica)
    SELECT id, schedule, scheduled_at, clock_timestamp(), :replica FROM input
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

# The two statements below find their rows with ``id = ANY(array)``, an index lookup per key
# whatever the planner thinks of the table: joined with a JSON function instead, a stale row
# estimate can make it rescan the keys for every row (quadratic in the chunk).

#: The publish fence: of the runs in ``keys`` (a text array), those this replica still
#: holds, whose lease has not run out and whose deadline has not passed, are leased until
#: ``hold`` seconds after ``start`` (their instant, when fenced ahead of it) or after now,
#: whichever is later; returns each with its lease and the database's clock as the statement
#: ran (a reading the dispatcher bounds its clock with). A recovery takeover needs the lease run
#: out, so of the two only one can win a row (guarantee 10).
FENCE = f"""
UPDATE {RUNS} AS r
SET lease_until = GREATEST(CAST(:start AS timestamptz), clock_timestamp())
    + make_interval(secs => :hold)
WHERE r.id = ANY(CAST(:keys AS text[])) AND r.status = {_CLAIMED} AND r.replica = :replica
  AND r.lease_until > clock_timestamp()
  AND (r.deadline IS NULL OR r.deadline >= clock_timestamp())
RETURNING r.id, r.lease_until, clock_timestamp()"""

#: Stamp the publish time of the runs in ``keys`` (a text array) and end their leases; returns
#: each key and the replica its row names now. No indexed column changes (the status waits for
#: :data:`SETTLE`), so on a page with room PostgreSQL updates each row in place: the mark is on
#: the critical path of a burst, between one chunk's broker write and the next.
MARK_PUBLISHED = f"""
UPDATE {RUNS} AS r
SET published_at = clock_timestamp(), lease_until = NULL
WHERE r.id = ANY(CAST(:keys AS text[]))
RETURNING r.id, r.replica"""

#: The marked runs in ``keys`` (a text array) still ``claimed`` become ``published`` (a
#: refusal noted at an earlier try is cleared). The worker may already have moved a row on
#: (started, even succeeded): its status stays.
SETTLE = f"""
UPDATE {RUNS} AS r
SET status = {_PUBLISHED}, error = NULL
WHERE r.id = ANY(CAST(:keys AS text[])) AND r.status = {_CLAIMED}
  AND r.published_at IS NOT NULL"""
