"""The Django admin pages (voltro_beat.contrib.django) in a project made by
``django-admin startproject``, served by ``runserver``, over the rows real beat replicas and a
real worker wrote (``conftest.seeded``).

Once with the tables in the project's PostgreSQL ``default`` database (UTC), once with them in
a SQLite file under a second alias and the router, the project in Europe/Berlin.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import httpx
import pytest
from admin_sites import DjangoSite
from conftest import GONE, LIVE, Seeded, django_site, failed_run, fired_by_revision
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

RUNS = "/admin/voltro_beat/run/"
CLAIMS = "/admin/voltro_beat/claim/"
REPLICAS = "/admin/voltro_beat/replica/"
SCHEDULES = "/admin/voltro_beat/schedule/"
SHARDS = "/admin/voltro_beat/shard/"
SINGLETONS = "/admin/voltro_beat/singletonstate/"
#: Rows per page of the Django admin.
PAGE = 100
PARTS = ("year", "month", "day")


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def site(request: pytest.FixtureRequest, seeded: Seeded, workdir: Path) -> Iterator[DjangoSite]:
    procs = ProcessSet()
    try:
        yield django_site(seeded, workdir / f"django-{request.param}", procs, request.param)
    finally:
        procs.close()


@pytest.fixture(scope="module")
def viewer(site: DjangoSite) -> httpx.Client:
    """A staff user with the view permissions only."""
    return site.login("viewer")


def keys_on(page: httpx.Response) -> list[str]:
    assert page.status_code == 200, page.status_code
    return [
        html.unescape(k)
        for k in re.findall(r'class="field-id"><a href="[^"]*">([^<]+)<', page.text)
    ]


def change_url(key: str) -> str:
    quoted = "".join(f"_{ord(c):02X}" if c in ':/_#?;@&=+$,"[]<>%\n\\' else c for c in key)
    return f"{RUNS}{quoted}/change/"


def test_the_scenario_left_every_kind_of_run(seeded: Seeded) -> None:
    statuses = {r["status"] for r in seeded.rows}
    assert {"succeeded", "failed", "missed"} <= statuses, statuses
    assert any(r["retries"] >= 1 and r["status"] == "succeeded" for r in seeded.rows)


def test_runs_list_newest_first_with_every_column(viewer: httpx.Client, seeded: Seeded) -> None:
    page = viewer.get(RUNS)
    assert keys_on(page) == seeded.newest()[:PAGE]
    assert f"{len(seeded.rows)} runs" in page.text
    for heading in ("key", *COLUMNS):
        assert f">{heading.capitalize()}<" in page.text or f">{heading}<" in page.text, heading
    assert "background:#c62828" in page.text  # a red badge: failed
    assert "Schedules overview" in page.text


@pytest.mark.parametrize("where", FILTERS, ids=str)
def test_each_filter(viewer: httpx.Client, seeded: Seeded, where: dict[str, str]) -> None:
    expected = seeded.newest(**where)
    assert expected
    # Django's parameters for the fields' choices filters, the schedule filter's own.
    params = {name if name == "schedule" else f"{name}__exact": v for name, v in where.items()}
    assert keys_on(viewer.get(RUNS, params=params)) == expected[:PAGE]


def test_filter_choices_list_statuses_outcomes_and_schedules(
    viewer: httpx.Client, seeded: Seeded
) -> None:
    page = viewer.get(RUNS).text
    for choice in ("status__exact=retrying", "coordination_outcome__exact=single"):
        assert choice in page
    for schedule in {r["schedule"] for r in seeded.rows}:
        assert f"?schedule={schedule}" in page


def test_date_filter_and_hierarchy(site: DjangoSite, viewer: httpx.Client, seeded: Seeded) -> None:
    page = viewer.get(RUNS).text
    past_week = re.search(r'href="(\?scheduled_at__gte=[^"]+)"[^>]*>\s*Past 7 days', page)
    assert past_week, "no 'Past 7 days' filter"
    assert keys_on(viewer.get(RUNS + html.unescape(past_week.group(1)))) == seeded.newest()[:PAGE]

    # The hierarchy offers the days that hold runs, in the project's time zone.
    zone = ZoneInfo(site.time_zone)

    def day_of(key: str) -> date:
        return seeded.row(key)["scheduled_at"].astimezone(zone).date()  # type: ignore[attr-defined,no-any-return]

    links = [
        parse_qs(urlsplit(html.unescape(href)).query)
        for href in re.findall(r'href="([^"]*scheduled_at__day=[^"]*)"', page)
    ]
    offered = {date(*(int(q[f"scheduled_at__{part}"][0]) for part in PARTS)) for q in links}
    assert offered == {day_of(key) for key in seeded.newest()}
    first = min(offered)
    params = dict(
        zip(
            (f"scheduled_at__{part}" for part in PARTS),
            (first.year, first.month, first.day),
            strict=True,
        )
    )
    on_first = [key for key in seeded.newest() if day_of(key) == first]
    assert keys_on(viewer.get(RUNS, params=params)) == on_first[:PAGE]


def test_search_by_key_and_by_task_id(viewer: httpx.Client, seeded: Seeded) -> None:
    run = failed_run(seeded)
    assert keys_on(viewer.get(RUNS, params={"q": run["id"]})) == [run["id"]]
    assert keys_on(viewer.get(RUNS, params={"q": run["task_id"]})) == [run["id"]]
    assert keys_on(viewer.get(RUNS, params={"q": "boom-2s"})) == []  # exact, not a substring


def test_detail_page_has_every_column_the_error_and_the_task_result(
    viewer: httpx.Client, seeded: Seeded
) -> None:
    run = failed_run(seeded)
    page = viewer.get(change_url(str(run["id"])))
    assert page.status_code == 200
    text = page.text
    for value in (run["id"], run["task_id"], run["task"], run["replica"], run["worker"]):
        assert html.escape(str(value)) in text, value
    assert "ValueError: boom" in text
    # The traceback the worker's failure signal stored after the error line.
    assert "Traceback (most recent call last):" in text and "in boom" in text
    assert re.search(r'href="/admin/django_celery_results/taskresult/\d+/change/">FAILURE<', text)
    assert "Save" not in text  # read-only


def test_detail_page_says_which_definition_fired_the_run(
    viewer: httpx.Client, seeded: Seeded, site: DjangoSite
) -> None:
    key = str(failed_run(seeded)["id"])
    assert "the app's beat_schedule" in html.unescape(viewer.get(change_url(key)).text)
    with fired_by_revision(site.store_url, key, 7):
        assert "7 (schedules table)" in viewer.get(change_url(key)).text


def test_late_and_stuck_runs_are_marked_and_filtered(
    viewer: httpx.Client, seeded: Seeded, site: DjangoSite
) -> None:
    for marker, key in (("late", seeded.late), ("stuck", seeded.stuck)):
        page = viewer.get(RUNS, params={"delay": marker})
        assert keys_on(page) == [key], marker
        assert re.findall(r'class="vb-delay"[^>]*>([^<]+)<', page.text) == [marker]
    assert 'class="vb-delay"' in viewer.get(change_url(seeded.stuck)).text
    # The threshold the project set (the SQLite site: 1 h 56 min), else an hour.
    threshold = "1 h 56 min" if site.time_zone != "UTC" else "1 h 0 min"
    assert f"stuck: running over {threshold}" in viewer.get(RUNS).text


def test_detail_page_of_a_retried_run(viewer: httpx.Client, seeded: Seeded) -> None:
    run = next(r for r in seeded.rows if r["retries"] and r["status"] == "succeeded")
    text = viewer.get(change_url(str(run["id"]))).text
    assert re.search(r'<label>Retries:</label>\s*<div class="readonly">1</div>', text)
    assert "none stored" in text


def test_schedules_overview(viewer: httpx.Client, seeded: Seeded, site: DjangoSite) -> None:
    before = datetime.now(UTC)
    page = viewer.get(SCHEDULES)
    assert page.status_code == 200
    lines = overview(page.text)
    assert set(lines) == {r["schedule"] for r in seeded.rows}
    zone = ZoneInfo(site.time_zone)
    for name, line in lines.items():
        expected = expected_overview(seeded.rows, name)
        assert (line.squares, line.rate, line.outcomes) == expected, name
        upcoming = [t.replace(tzinfo=zone) for t in line.upcoming]
        assert len(upcoming) == 3 and upcoming == sorted(upcoming), name
        assert before - timedelta(seconds=1) < upcoming[0] < before + timedelta(seconds=5), name
    assert lines["boom-2s"].rate == "0%"
    # The live replica serves the default group, the app's only one: no warning.
    assert "vb-unserved" not in page.text


def test_nobody_adds_changes_or_deletes(site: DjangoSite, seeded: Seeded) -> None:
    admin = site.login("admin")  # a superuser
    key = seeded.newest()[0]
    token = admin.cookies["csrftoken"]
    for model in (RUNS, CLAIMS, REPLICAS):
        assert admin.get(f"{model}add/").status_code == 403
    assert (
        admin.post(
            change_url(key), data={"csrfmiddlewaretoken": token, "status": "failed"}
        ).status_code
        == 403
    )
    delete = change_url(key).replace("/change/", "/delete/")
    assert admin.get(delete).status_code == 403
    assert admin.post(delete, data={"csrfmiddlewaretoken": token, "post": "yes"}).status_code == 403
    changelist = admin.get(RUNS).text
    assert "_selected_action" not in changelist and f'href="{RUNS}add/"' not in changelist
    assert admin.get(change_url(key)).status_code == 200  # still viewable


def test_who_sees_the_pages(site: DjangoSite) -> None:
    outsider = site.session_of("outsider")  # logged in, has view_run, but not staff
    for path in (RUNS, SCHEDULES):
        answer = outsider.get(path)
        assert answer.status_code == 302 and answer.headers["location"].startswith("/admin/login/")
    assert site.client().get(RUNS).headers["location"].startswith("/admin/login/")
    staff = site.login("staff")  # staff without the view permission
    assert staff.get(RUNS).status_code == 403
    assert staff.get(REPLICAS).status_code == 403
    assert staff.get(SCHEDULES).status_code == 403


def test_replicas_list_and_detail(viewer: httpx.Client) -> None:
    listed, detail = viewer.get(REPLICAS), viewer.get(f"{REPLICAS}{LIVE.name}/change/")
    assert listed.status_code == detail.status_code == 200
    check_replicas(listed.text, detail.text, LIVE, GONE)
    assert '"boom-2s": "1e1e1e1e1e1e1e1e"' in html.unescape(detail.text)
    assert "Save" not in detail.text  # read-only


def test_shards_and_singletons(viewer: httpx.Client) -> None:
    shards, singletons = viewer.get(SHARDS), viewer.get(SINGLETONS)
    assert shards.status_code == singletons.status_code == 200
    check_shards(shards.text)
    check_singletons(singletons.text)
    assert "Add shard" not in shards.text
