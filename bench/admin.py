"""The admin pages on a big run table: time to first byte and queries per page.

    .venv/bin/python -m bench.admin                      # 1,000,000 rows, about 2 minutes
    .venv/bin/python -m bench.admin --rows 100000 --plans plans.md --keep

Fills a dedicated PostgreSQL database (``voltro_bench_admin``, dropped and made again) with
``--rows`` run rows: ``--schedules`` schedules due together every minute, back from now (a
week for the defaults), 2 % failed, 1 % missed, one schedule in ``single`` coordination. The
rows go in at migration 0003 and the newest migration (the admin's indexes) is timed on them.
Then it serves the Django admin (a ``startproject`` project, ``runserver``, DEBUG off) and
``voltro-beat admin`` (uvicorn) over it, the same servers the tests drive
(``tests/contrib/admin_sites.py``), and for each page measures:

* time to first byte over HTTP, logged in: the median of ``--repeat`` requests after one
  warm-up (both servers render the whole page before sending its first byte);
* the statements it runs, counted in-process (Django's test client in ``manage.py shell``,
  SQLAlchemy's cursor events under Starlette's test client), and the time they took.

It prints a markdown table and writes ``bench/results/admin.json``.
``--plans FILE`` writes ``EXPLAIN (ANALYZE, BUFFERS)`` of every statement the Django pages run
on voltro_beat's tables. The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "contrib"))

from admin_sites import DjangoSite, ProcessSet, SqladminSite  # noqa: E402

from voltro_beat.store.database import Database  # noqa: E402
from voltro_beat.store.migrations import runner  # noqa: E402

SERVER = "postgresql://root@127.0.0.1:5432"
DATABASE = "voltro_bench_admin"
STORE = f"postgresql+psycopg://root@127.0.0.1:5432/{DATABASE}"
#: Django path, sqladmin path, for each page measured.
PAGES = {
    "runs, newest first": ("/admin/voltro_beat/run/", "/admin/run/list"),
    "runs, status failed": (
        "/admin/voltro_beat/run/?status__exact=failed",
        "/admin/run/list?status=failed",
    ),
    "runs, outcome single (1 %)": (
        "/admin/voltro_beat/run/?coordination_outcome__exact=single",
        "/admin/run/list?coordination_outcome=single",
    ),
    "runs, one schedule": (
        "/admin/voltro_beat/run/?schedule=sched-042",
        "/admin/run/list?schedule=sched-042",
    ),
    "run, search by key": ("/admin/voltro_beat/run/?q={key}", "/admin/run/list?search={key}"),
    "schedules overview": ("/admin/voltro_beat/schedule/", "/admin/schedules"),
}

SEED = """
INSERT INTO _voltro_schedule_runs (id, schedule, task, task_id, scheduled_at,
    coordination_outcome, status, reason, replica, worker, claimed_at, published_at,
    started_at, finished_at, duration, retries, error)
SELECT s.name || '@' || to_char(t.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS'),
    s.name, 'bench.task', md5(s.name || t.at::text)::uuid::text, t.at,
    CASE WHEN s.i = 99 THEN 'single' ELSE 'won_lock' END,
    CASE WHEN (t.n + s.i) %% 50 = 7 THEN 'failed'
         WHEN (t.n * 7 + s.i) %% 100 = 3 THEN 'missed' ELSE 'succeeded' END,
    CASE WHEN (t.n * 7 + s.i) %% 100 = 3 AND (t.n + s.i) %% 50 <> 7 THEN 'catch_up' END,
    'r' || (t.n %% 3 + 1), 'celery@worker:' || (1000 + s.i %% 4),
    t.at - interval '300 microseconds', t.at + interval '2 milliseconds',
    t.at + interval '5 milliseconds', t.at + interval '50 milliseconds', 0.045, 0,
    CASE WHEN (t.n + s.i) %% 50 = 7 THEN 'ValueError: boom' END
FROM (SELECT i, 'sched-' || lpad(i::text, 3, '0') AS name
      FROM generate_series(0, %(schedules)s - 1) AS i) AS s
CROSS JOIN (SELECT n, date_trunc('minute', now()) - n * interval '1 minute' AS at
            FROM generate_series(0, %(minutes)s - 1) AS n) AS t
"""


def seed(rows: int, schedules: int) -> dict[str, float]:
    """Make the database, fill it at revision 0003, then time the upgrade to the newest."""
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    database = Database.open(STORE)
    timings = {}
    with database.connect() as conn, conn.begin():
        runner.upgrade(conn, "0003")
    started = time.perf_counter()
    with psycopg.connect(f"{SERVER}/{DATABASE}", autocommit=True) as conn:
        conn.execute(SEED, {"schedules": schedules, "minutes": rows // schedules})
        timings["insert s"] = time.perf_counter() - started
        started = time.perf_counter()
        with database.connect() as sa_conn, sa_conn.begin():
            runner.upgrade(sa_conn)
        timings["migration 0004 s"] = time.perf_counter() - started
        conn.execute("VACUUM ANALYZE _voltro_schedule_runs")
        timings["rows"] = conn.execute("SELECT count(*) FROM _voltro_schedule_runs").fetchone()[0]
    database.dispose()
    return timings


def newest_key() -> str:
    with psycopg.connect(f"{SERVER}/{DATABASE}") as conn:
        row = conn.execute(
            "SELECT id FROM _voltro_schedule_runs ORDER BY scheduled_at DESC, id DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return str(row[0])


def ttfb(base: str, path: str, cookie: str, repeat: int) -> tuple[int, float]:
    """HTTP status and median seconds to the first byte of ``path`` (after one warm-up)."""
    parts = urlsplit(base)
    times = []
    status = 0
    for attempt in range(repeat + 1):
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        started = time.perf_counter()
        conn.request("GET", path, headers={"Cookie": cookie})
        answer = conn.getresponse()
        elapsed = time.perf_counter() - started
        answer.read()
        conn.close()
        status = answer.status
        if attempt:
            times.append(elapsed)
    return status, statistics.median(times)


DJANGO_QUERIES = """
import json
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
client = Client()
client.force_login(User.objects.get(username="viewer"))
found = {{}}
for name, path in {pages!r}.items():
    with CaptureQueriesContext(connection) as captured:
        status = client.get(path).status_code
    found[name] = [status, captured.captured_queries]
print(json.dumps(found))
"""


def django_queries(site: DjangoSite, pages: dict[str, str]) -> dict[str, Any]:
    output = site.shell(DJANGO_QUERIES.format(pages=pages))
    found: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return found


def sqladmin_queries(pages: dict[str, str]) -> dict[str, Any]:
    """Statements per page, counted with SQLAlchemy's cursor events (no login: the login is
    no query)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from starlette.testclient import TestClient

    from voltro_beat.contrib.sqladmin import server

    statements: list[float] = []
    started: dict[int, float] = {}

    def before(conn: Any, cursor: Any, *_: Any) -> None:
        started[id(cursor)] = time.perf_counter()

    def after(conn: Any, cursor: Any, *_: Any) -> None:
        statements.append(time.perf_counter() - started.pop(id(cursor)))

    event.listen(Engine, "before_cursor_execute", before)
    event.listen(Engine, "after_cursor_execute", after)
    found = {}
    with TestClient(server.create_app(STORE, None)) as client:
        for name, path in pages.items():
            client.get(path)  # warm-up: connections, pool pre-ping
            statements.clear()
            status = client.get(path).status_code
            found[name] = [status, [{"time": f"{t:.4f}"} for t in statements]]
    return found


def explain(captured: dict[str, Any]) -> str:
    """EXPLAIN ANALYZE of each statement on voltro_beat's tables, as markdown."""
    parts = []
    with psycopg.connect(f"{SERVER}/{DATABASE}") as conn:
        for name, (_status, queries) in captured.items():
            for query in queries:
                sql = query["sql"]
                if "_voltro_" not in sql:
                    continue
                plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}").fetchall()
                text = "\n".join(row[0] for row in plan)
                parts.append(f"### {name}\n\n```sql\n{sql}\n```\n\n```\n{text}\n```\n")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--plans", type=Path, help="write the Django pages' query plans here")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    print(f"seeding {args.rows:,} rows ...", flush=True)
    timings = seed(args.rows, args.schedules)
    print(json.dumps(timings))
    key = newest_key()
    django_pages = {name: paths[0].format(key=key) for name, paths in PAGES.items()}
    sqladmin_pages = {name: paths[1].format(key=key) for name, paths in PAGES.items()}
    procs = ProcessSet()
    workdir = Path(tempfile.mkdtemp(prefix="bench-admin-"))
    try:
        django = DjangoSite.create(
            workdir / "django",
            procs,
            databases={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": DATABASE,
                                   "USER": "root", "HOST": "127.0.0.1", "PORT": 5432}},
            settings={"DEBUG": False},
        )  # fmt: skip
        (workdir / "sqladmin").mkdir()
        sqladmin = SqladminSite.start(workdir / "sqladmin", procs, STORE)
        django_cookie = "sessionid=" + django.login("viewer").cookies["sessionid"]
        sqladmin_cookie = "session=" + sqladmin.login().cookies["session"]
        django_counts = django_queries(django, django_pages)
        sqladmin_counts = sqladmin_queries(sqladmin_pages)
        print(
            "\n| page | Django TTFB | Django queries (voltro tables) | sqladmin TTFB "
            "| sqladmin queries |\n|---|---|---|---|---|"
        )
        results: dict[str, Any] = {"rows": args.rows, "seed": timings, "pages": {}}
        for name in PAGES:
            d_status, d_ttfb = ttfb(django.base, django_pages[name], django_cookie, args.repeat)
            s_status, s_ttfb = ttfb(
                sqladmin.base, sqladmin_pages[name], sqladmin_cookie, args.repeat
            )
            d_queries = django_counts[name][1]
            ours = [q for q in d_queries if "_voltro_" in q["sql"]]
            d_ms = sum(float(q["time"]) for q in ours) * 1000
            s_queries = sqladmin_counts[name][1]
            s_ms = sum(float(q["time"]) for q in s_queries) * 1000
            assert {d_status, s_status, django_counts[name][0], sqladmin_counts[name][0]} == {200}
            results["pages"][name] = {
                "django": {"ttfb_s": d_ttfb, "queries": len(d_queries), "voltro_queries": len(ours),
                           "voltro_query_ms": d_ms},
                "sqladmin": {"ttfb_s": s_ttfb, "queries": len(s_queries), "query_ms": s_ms},
            }  # fmt: skip
            print(
                f"| {name} | {d_ttfb * 1000:.0f} ms | {len(d_queries)} ({len(ours)}, "
                f"{d_ms:.1f} ms) | {s_ttfb * 1000:.0f} ms | {len(s_queries)} ({s_ms:.1f} ms) |"
            )  # fmt: skip
        out = ROOT / "bench" / "results" / "admin.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(f"\nresults: {out}")
        if args.plans:
            args.plans.write_text(explain(django_counts))
            print(f"\nplans: {args.plans}")
    finally:
        procs.close()
        if not args.keep:
            with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


if __name__ == "__main__":
    main()
