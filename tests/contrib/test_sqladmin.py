"""The sqladmin views (voltro_beat.contrib.sqladmin) served by ``voltro-beat admin`` (uvicorn)
over the rows real beat replicas and a real worker wrote (``conftest.seeded``, PostgreSQL)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from admin_sites import SqladminSite, run_admin_command
from conftest import APP, GONE, LIVE, Seeded, failed_run, fired_by_revision
from pages import (
    COLUMNS,
    FILTERS,
    check_replicas,
    check_shards,
    check_singletons,
    expected_overview,
    overview,
)
from vbt_harness import ProcessSet

RUNS = "/admin/run/list"
#: Rows per page (the views' page_size).
PAGE = 50


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcessSet]:
    started = ProcessSet()
    yield started
    started.close()


@pytest.fixture(scope="module")
def site(seeded: Seeded, workdir: Path, procs: ProcessSet) -> SqladminSite:
    root = workdir / "sqladmin"
    root.mkdir()
    return SqladminSite.start(root, procs, seeded.store_url, args=("-A", APP), env=seeded.env)


@pytest.fixture(scope="module")
def operator(site: SqladminSite) -> httpx.Client:
    return site.login()


def keys_on(page: httpx.Response) -> list[str]:
    assert page.status_code == 200, page.status_code
    links = re.findall(r'href="[^"]*/admin/run/details/([^"]+)"', page.text)
    return list(dict.fromkeys(unquote(html.unescape(link)) for link in links))


def test_unauthenticated_requests_go_to_the_login(site: SqladminSite) -> None:
    anonymous = site.client()
    for method, path in (
        ("GET", RUNS),
        ("GET", "/admin/schedules"),
        ("GET", "/admin/claim/list"),
        ("POST", "/admin/run/create"),
    ):
        answer = anonymous.request(method, path)
        assert answer.status_code == 302, (method, path)
        assert answer.headers["location"].endswith("/admin/login"), (method, path)
    wrong = anonymous.post("/admin/login", data={"username": site.user, "password": "guess"})
    assert wrong.status_code != 302
    assert anonymous.get(RUNS).status_code == 302


def test_runs_list_newest_first(operator: httpx.Client, seeded: Seeded) -> None:
    page = operator.get(RUNS)
    assert keys_on(page) == seeded.newest()[:PAGE]
    assert f"of {len(seeded.rows)} items" in page.text
    for label in ("schedule", *COLUMNS):
        assert f">{label}<" in page.text or f"{label}\n" in page.text, label
    assert "background:#c62828" in page.text  # a red badge: failed


@pytest.mark.parametrize("where", [*FILTERS, {}], ids=str)
def test_each_filter(operator: httpx.Client, seeded: Seeded, where: dict[str, str]) -> None:
    expected = seeded.newest(**where)
    assert expected
    # {}: the period filter's past week, which holds every row.
    params = where or {"scheduled": "week"}
    assert keys_on(operator.get(RUNS, params=params)) == expected[:PAGE]


def test_search_by_key_and_by_task_id(operator: httpx.Client, seeded: Seeded) -> None:
    run = failed_run(seeded)
    assert keys_on(operator.get(RUNS, params={"search": run["id"]})) == [run["id"]]
    assert keys_on(operator.get(RUNS, params={"search": run["task_id"]})) == [run["id"]]
    assert keys_on(operator.get(RUNS, params={"search": "boom-2s"})) == []


def test_detail_page(operator: httpx.Client, seeded: Seeded) -> None:
    run = failed_run(seeded)
    page = operator.get(f"/admin/run/details/{run['id']}")
    assert page.status_code == 200
    for value in (run["id"], run["task_id"], run["task"], run["replica"], run["worker"]):
        assert html.escape(str(value)) in page.text, value
    assert "ValueError: boom" in page.text
    # The traceback the worker's failure signal stored after the error line.
    assert "Traceback (most recent call last):" in page.text and "in boom" in page.text


def test_detail_page_says_which_definition_fired_the_run(
    operator: httpx.Client, seeded: Seeded
) -> None:
    key = str(failed_run(seeded)["id"])
    page = f"/admin/run/details/{key}"
    assert "the app's beat_schedule" in html.unescape(operator.get(page).text)
    with fired_by_revision(seeded.store_url, key, 7):
        assert "7 (schedules table)" in operator.get(page).text


def test_late_and_stuck_runs_are_marked_and_filtered(
    operator: httpx.Client, seeded: Seeded
) -> None:
    for marker, key in (("late", seeded.late), ("stuck", seeded.stuck)):
        page = operator.get(RUNS, params={"delay": marker})
        assert keys_on(page) == [key], marker
        assert re.findall(r'class="vb-delay[^"]*"[^>]*>([^<]+)<', page.text) == [marker]
    assert ">stuck<" in operator.get(f"/admin/run/details/{seeded.stuck}").text


def test_the_stuck_threshold_is_configurable(
    seeded: Seeded, workdir: Path, procs: ProcessSet
) -> None:
    root = workdir / "sqladmin-stuck-after"
    root.mkdir()
    # Three hours: the run started two hours ago is not stuck yet.
    patient = SqladminSite.start(
        root, procs, seeded.store_url, env={"VOLTRO_BEAT_ADMIN_STUCK_AFTER": "10800"}
    ).login()
    assert keys_on(patient.get(RUNS, params={"delay": "stuck"})) == []
    assert keys_on(patient.get(RUNS, params={"delay": "late"})) == [seeded.late]


def test_the_admin_opens_on_the_schedules_overview(operator: httpx.Client) -> None:
    landing = operator.get("/admin/")
    assert landing.status_code == 302 and landing.headers["location"].endswith("/admin/schedules")


def test_schedules_overview(operator: httpx.Client, seeded: Seeded) -> None:
    before = datetime.now(UTC)
    page = operator.get("/admin/schedules")
    assert page.status_code == 200
    lines = overview(page.text)
    assert set(lines) == {r["schedule"] for r in seeded.rows}
    for name, line in lines.items():
        assert (line.squares, line.rate, line.outcomes) == expected_overview(seeded.rows, name)
        upcoming = [t.replace(tzinfo=UTC) for t in line.upcoming]
        assert len(upcoming) == 3 and upcoming == sorted(upcoming), name
        assert before - timedelta(seconds=1) < upcoming[0] < before + timedelta(seconds=5), name
    # The live replica serves the default group, the app's only one: no warning.
    assert "vb-unserved" not in page.text


def test_writes_are_refused(operator: httpx.Client, seeded: Seeded) -> None:
    key = seeded.newest()[0]
    refused = [
        ("GET", "/admin/run/create"),
        ("POST", "/admin/run/create"),
        ("GET", f"/admin/run/edit/{key}"),
        ("POST", f"/admin/run/edit/{key}"),
        ("DELETE", f"/admin/run/delete?pks={key}"),
        ("GET", "/admin/claim/create"),
        ("GET", "/admin/replica/create"),
        ("POST", f"/admin/replica/edit/{LIVE.name}"),
        ("DELETE", f"/admin/replica/delete?pks={LIVE.name}"),
    ]
    for method, path in refused:
        assert operator.request(method, path).status_code == 403, (method, path)
    assert keys_on(operator.get(RUNS, params={"search": key})) == [key]


def test_the_command_refuses_to_start_without_a_login(seeded: Seeded) -> None:
    bare = run_admin_command(seeded.store_url, "--port", "1")
    assert bare.returncode != 0
    assert "VOLTRO_BEAT_ADMIN_PASSWORD" in bare.stderr and "no default password" in bare.stderr
    half = run_admin_command(
        seeded.store_url, "--port", "1", env={"VOLTRO_BEAT_ADMIN_USER": "operator"}
    )
    assert half.returncode != 0
    exposed = run_admin_command(seeded.store_url, "--host", "0.0.0.0", "--no-auth", "--port", "1")
    assert exposed.returncode != 0 and "127.0.0.1" in exposed.stderr


def test_no_auth_serves_loopback_only(seeded: Seeded, workdir: Path, procs: ProcessSet) -> None:
    root = workdir / "sqladmin-no-auth"
    root.mkdir()
    open_site = SqladminSite.start(root, procs, seeded.store_url, args=("--no-auth",), user=None)
    assert keys_on(open_site.client().get(RUNS)) == seeded.newest()[:PAGE]


def test_replicas_list_and_detail(operator: httpx.Client) -> None:
    listed, detail = (
        operator.get("/admin/replica/list"),
        operator.get(f"/admin/replica/details/{LIVE.name}"),
    )
    assert listed.status_code == detail.status_code == 200
    check_replicas(listed.text, detail.text, LIVE, GONE)
    assert '"boom-2s": "1e1e1e1e1e1e1e1e"' in html.unescape(detail.text)


def test_shards_and_singletons(operator: httpx.Client) -> None:
    shards = operator.get("/admin/shard/list")
    singletons = operator.get("/admin/singleton-state/list")
    assert shards.status_code == singletons.status_code == 200
    check_shards(shards.text)
    check_singletons(singletons.text)
