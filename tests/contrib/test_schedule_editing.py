"""The schedules table edited in both admins (real servers, a real store): the same checks as
``voltro-beat schedules`` with the field named, the next instants before saving, an edit based
on a stale revision refused, each change recorded with the admin's user; a user without the
permissions cannot edit. The same walk in headless Chromium (its screenshots beside the
others, ``conftest.screenshots``)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from admin_sites import PASSWORD, DjangoSite, SqladminSite
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from test_browser import click, wait_for
from vbt_harness import ProcessSet

from voltro_beat.store.database import Database
from voltro_beat.store.schedule_rows import ScheduleRows

GOOD = '{"task": "proj.report", "schedule": "*/5 * * * *"}'
BAD = '{"task": "proj.report", "schedule": "61 * * * *"}'
HOURLY = '{"task": "proj.report", "schedule": "0 * * * *"}'


@pytest.fixture
def procs() -> Iterator[ProcessSet]:
    started = ProcessSet()
    yield started
    started.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "store.sqlite3"
    database = Database.open(f"sqlite:///{path}")
    database.upgrade()
    database.dispose()
    yield str(path)


def django_site(tmp_path: Path, procs: ProcessSet, store: str) -> DjangoSite:
    """A Django project with voltro_beat's tables in the SQLite ``store`` (a second alias)."""
    return DjangoSite.create(
        tmp_path / "project",
        procs,
        databases={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "dj.db")},
            "voltro": {"ENGINE": "django.db.backends.sqlite3", "NAME": store},
        },
        settings={
            "VOLTRO_BEAT_DATABASE": "voltro",
            "DATABASE_ROUTERS": ["voltro_beat.contrib.django.routers.VoltroBeatRouter"],
        },
    )


def rows(store: str) -> ScheduleRows:
    return ScheduleRows(Database.open(f"sqlite:///{store}"))


def text_of(page: httpx.Response) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text)))


def test_the_django_admin_edits_through_the_table(
    tmp_path: Path, procs: ProcessSet, store: str
) -> None:
    site = django_site(tmp_path, procs, store)
    admin = site.login("admin")
    add = "/admin/voltro_beat/storedschedule/add/"

    def post(url: str, **data: str) -> httpx.Response:
        page = admin.get(url)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text[:300]
        return admin.post(url, data={"csrfmiddlewaretoken": token.group(1), **data})

    preview = post(add, name="report", definition=GOOD, enabled="on", _preview="1")
    assert "Not saved. Next instants:" in text_of(preview)
    bad = post(add, name="report", definition=BAD, enabled="on")
    assert "schedule 'report', field 'schedule'" in text_of(bad), text_of(bad)[:2000]
    assert rows(store).all() == []
    saved = post(add, name="report", definition=GOOD, enabled="on", _save="Save")
    assert saved.status_code == 302, text_of(saved)[:2000]
    (row,) = rows(store).all()
    assert (row.revision, row.changed_by, row.definition["schedule"]) == (1, "admin", "*/5 * * * *")
    change = "/admin/voltro_beat/storedschedule/report/change/"
    page = text_of(admin.get(change))
    assert "applied by 0 of 0 live replicas" in page
    assert "r1" in page and "add by admin" in page
    assert "next instants" in page.lower()
    edited = post(change, definition=HOURLY, enabled="on", revision="1", _save="Save")
    assert edited.status_code == 302, text_of(edited)[:2000]
    stale = post(change, definition=GOOD, revision="1", _save="Save")
    assert "at revision 2, not 1" in text_of(stale)
    delete = "/admin/voltro_beat/storedschedule/report/delete/"
    assert post(delete, post="yes").status_code == 302
    history = rows(store).history("report")
    assert [(c.action, c.changed_by) for c in history] == [
        ("add", "admin"),
        ("set", "admin"),
        ("remove", "admin"),
    ]
    viewer = site.login("viewer")
    assert viewer.get(add).status_code == 403


def test_sqladmin_edits_through_the_table(tmp_path: Path, procs: ProcessSet, store: str) -> None:
    site = SqladminSite.start(tmp_path, procs, f"sqlite:///{store}")
    admin = site.login()
    create = "/admin/stored-schedule/create"
    preview = admin.post(
        create,
        data={
            "name": "report",
            "definition": GOOD,
            "enabled": "y",
            "save": "Preview next instants",
        },
    )
    assert "Not saved. Next instants:" in text_of(preview)
    bad = admin.post(create, data={"name": "report", "definition": BAD, "save": "Save"})
    assert "schedule 'report', field 'schedule'" in text_of(bad)
    saved = admin.post(
        create, data={"name": "report", "definition": GOOD, "enabled": "y", "save": "Save"}
    )
    assert saved.status_code == 302
    (row,) = rows(store).all()
    assert (row.revision, row.changed_by) == (1, "operator")
    edit = "/admin/stored-schedule/edit/report"
    page = admin.get(edit)
    assert 'name="revision" type="hidden" value="1"' in page.text
    assert "add by operator" in text_of(page)
    edited = admin.post(edit, data={"definition": HOURLY, "revision": "1", "save": "Save"})
    assert edited.status_code == 302
    assert not rows(store).all()[0].enabled  # the box left unticked: disabled, in a change
    stale = admin.post(edit, data={"definition": GOOD, "revision": "1", "save": "Save"})
    assert "at revision 3, not 1" in text_of(stale)
    assert admin.delete("/admin/stored-schedule/delete?pks=report").status_code == 200
    assert [c.action for c in rows(store).history("report")] == ["add", "set", "disable", "remove"]


@dataclass(frozen=True)
class Editing:
    """Where one admin keeps what the edit walk uses."""

    name: str
    login: str
    submit: str
    add: str
    save: str
    preview: str
    error: str
    change: str


DJANGO_EDIT = Editing(
    name="django",
    login="/admin/login/",
    submit="input[type=submit]",
    add="/admin/voltro_beat/storedschedule/add/",
    save="input[name=_save]",
    preview="input[name=_preview]",
    error=".errorlist",
    change="/admin/voltro_beat/storedschedule/report/change/",
)
SQLADMIN_EDIT = Editing(
    name="sqladmin",
    login="/admin/login",
    submit="button[type=submit]",
    add="/admin/stored-schedule/create",
    save="input[value=Save]",
    preview="input[value='Preview next instants']",
    error=".alert-danger",
    change="/admin/stored-schedule/edit/report",
)


def edit_walk(browser: Any, base: str, user: str, admin: Editing, shots: Path) -> None:
    """Log in, add a schedule with a bad cron field (refused, the field named), preview the
    fixed one, save it, open it (applied-by and its changes), change its cadence and disable
    it in one save."""
    browser.get(base + admin.login)
    wait_for(browser, "input[name=username]").send_keys(user)
    browser.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(PASSWORD)
    click(browser, admin.submit)
    WebDriverWait(browser, 20).until(expected_conditions.url_changes(base + admin.login))
    browser.get(base + admin.add)
    wait_for(browser, "input[name=name]").send_keys("report")
    definition = browser.find_element(By.CSS_SELECTOR, "textarea[name=definition]")
    definition.send_keys(BAD)
    click(browser, admin.save)
    error = wait_for(browser, admin.error).text
    assert "schedule 'report', field 'schedule'" in error, error
    browser.save_screenshot(str(shots / f"{admin.name}-schedule-refused.png"))
    definition = browser.find_element(By.CSS_SELECTOR, "textarea[name=definition]")
    definition.clear()
    definition.send_keys(GOOD)
    click(browser, admin.preview)
    # The refused page's error stays until the preview's page replaces it.
    WebDriverWait(browser, 20).until(
        expected_conditions.text_to_be_present_in_element(
            (By.CSS_SELECTOR, admin.error), "Not saved. Next instants:"
        )
    )
    browser.save_screenshot(str(shots / f"{admin.name}-schedule-preview.png"))
    click(browser, admin.save)
    WebDriverWait(browser, 20).until(expected_conditions.url_changes(base + admin.add))
    browser.get(base + admin.change)
    body = wait_for(browser, "body").text
    assert "add by" in body, body[:2000]
    browser.save_screenshot(str(shots / f"{admin.name}-schedule-edit.png"))
    # A cadence change, and disabled, in one save: two changes.
    definition = browser.find_element(By.CSS_SELECTOR, "textarea[name=definition]")
    definition.clear()
    definition.send_keys(HOURLY)
    enabled = browser.find_element(By.CSS_SELECTOR, "input[name=enabled]")
    browser.execute_script("arguments[0].click()", enabled)  # sqladmin's switch hides the box
    click(browser, admin.save)
    WebDriverWait(browser, 20).until(expected_conditions.url_changes(base + admin.change))
    browser.get(base + admin.change)
    body = wait_for(browser, "body").text
    assert "set by" in body and "disable by" in body, body[:2000]


def test_editing_in_chromium(
    browser: Any, tmp_path: Path, procs: ProcessSet, store: str, screenshots: Path
) -> None:
    django = django_site(tmp_path, procs, store)
    edit_walk(browser, django.base, "admin", DJANGO_EDIT, screenshots)
    (row,) = rows(store).all()
    assert (row.changed_by, row.revision, row.enabled) == ("admin", 3, False)
    assert row.definition["schedule"] == "0 * * * *"
    rows(store).write("report", "remove", expected=3, after=None, by="test")
    sqladmin = SqladminSite.start(tmp_path, procs, f"sqlite:///{store}")
    browser.delete_all_cookies()
    edit_walk(browser, sqladmin.base, str(sqladmin.user), SQLADMIN_EDIT, screenshots)
    (row,) = rows(store).all()
    assert (row.changed_by, row.enabled) == ("operator", False)
    assert [c.action for c in rows(store).history("report")][-3:] == ["add", "set", "disable"]
