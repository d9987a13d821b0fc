"""Both admins in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, Selenium):
log in, open the runs list (every column in view at 1,400 px, no row checkboxes, no Actions
menu), filter by ``failed``, open a run (its traceback), the late and stuck runs, the replicas
(their clock offset), the schedules overview (where sqladmin opens).

Each step saves a screenshot (``conftest.screenshots``); docs/admin.md shows them, refreshed
with ``VBT_SCREENSHOTS=docs/images .venv/bin/python -m pytest tests/contrib/test_browser.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from admin_sites import PASSWORD, SqladminSite
from conftest import APP, LIVE, Seeded, django_site
from pages import COLUMNS
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from vbt_harness import ProcessSet


@pytest.fixture
def procs() -> Iterator[ProcessSet]:
    started = ProcessSet()
    yield started
    started.close()


def wait_for(browser: Any, selector: str) -> Any:
    return WebDriverWait(browser, 20).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, selector))
    )


def click(browser: Any, selector: str) -> None:
    WebDriverWait(browser, 20).until(
        expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, selector))
    ).click()


@dataclass(frozen=True)
class Admin:
    """Where one admin keeps what the walk uses."""

    name: str
    login: str
    submit: str
    runs: str
    failed_filter: str
    badges: str
    first_run: str
    to_schedules: str
    replicas: str
    #: The runs list's column naming the run, besides :data:`pages.COLUMNS`.
    name_column: str
    #: What a failed run's page shows besides the error.
    run_shows: tuple[str, ...] = ()


DJANGO = Admin(
    name="django",
    login="/admin/login/",
    submit="input[type=submit]",
    runs="/admin/voltro_beat/run/",
    failed_filter='#changelist-filter a[href*="status__exact=failed"]',
    badges="td.field-status_badge",
    first_run="#result_list th.field-id a",
    to_schedules=".object-tools a",
    replicas="/admin/voltro_beat/replica/",
    name_column="key",
    run_shows=("FAILURE",),  # the link to django-celery-results' result
)
SQLADMIN = Admin(
    name="sqladmin",
    login="/admin/login",
    submit="button[type=submit]",
    runs="/admin/run/list",
    failed_filter='a[href*="status=failed"]',
    badges="tbody .badge",
    first_run='tbody a[href*="/admin/run/details/"]',
    to_schedules='a[href$="/admin/schedules"]',
    replicas="/admin/replica/list",
    name_column="schedule",
)
#: The width the runs list must fit, every column in view.
WIDTH = 1400
#: Each heading of the page's table, and how far it reaches past the right edge of the box
#: that shows the table (negative: in view; both admins scroll a table too wide for its box).
_HEADINGS = """return [...document.querySelectorAll('thead th')].map(th => [
  th.innerText.trim().toLowerCase(),
  th.getBoundingClientRect().right - Math.min(
    th.closest('table').parentElement.getBoundingClientRect().right,
    document.documentElement.clientWidth)]);"""


def walk(browser: Any, base: str, user: str, admin: Admin, seeded: Seeded, shots: Path) -> None:
    """Log in, open the runs, filter failed, open a run, the late and stuck runs, the replicas,
    the schedules; a screenshot of each page."""
    browser.get(base + admin.login)
    wait_for(browser, "input[name=username]").send_keys(user)
    browser.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(PASSWORD)
    click(browser, admin.submit)
    WebDriverWait(browser, 20).until(expected_conditions.url_changes(base + admin.login))

    browser.set_window_size(WIDTH, 1000)
    browser.get(base + admin.runs)
    wait_for(browser, admin.badges)
    browser.save_screenshot(str(shots / f"{admin.name}-runs.png"))
    past = dict(browser.execute_script(_HEADINGS))
    for heading in (admin.name_column, *COLUMNS):
        assert past.get(heading, 1) <= 0, (heading, sorted(past.items()))
    # Read-only: nothing to select, no action to take.
    assert not [
        e
        for e in browser.find_elements(By.CSS_SELECTOR, "input[type=checkbox]")
        if e.is_displayed()
    ]
    assert not [
        e
        for e in browser.find_elements(By.XPATH, "//*[normalize-space(text())='Actions']")
        if e.is_displayed()
    ]
    browser.set_window_size(1600, 1000)

    click(browser, admin.failed_filter)
    WebDriverWait(browser, 20).until(expected_conditions.url_contains("failed"))
    assert {e.text for e in browser.find_elements(By.CSS_SELECTOR, admin.badges)} == {"failed"}
    browser.save_screenshot(str(shots / f"{admin.name}-runs-failed.png"))

    click(browser, admin.first_run)
    wait_for(browser, "pre")
    error = browser.find_element(By.CSS_SELECTOR, "pre").text
    assert error.startswith("ValueError: boom"), error
    assert "Traceback (most recent call last):" in error and "in boom" in error, error
    for text in admin.run_shows:
        assert text in browser.page_source, text
    browser.save_screenshot(str(shots / f"{admin.name}-run.png"))

    for marker, key in (("late", seeded.late), ("stuck", seeded.stuck)):
        browser.get(f"{base}{admin.runs}?delay={marker}")
        wait_for(browser, ".vb-delay")
        assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".vb-delay")] == [marker]
        # The one run marked: its schedule and instant (both sites show UTC).
        schedule, instant = key.split("@")
        (row,) = browser.find_elements(By.CSS_SELECTOR, "tbody tr:has(.vb-delay)")
        assert schedule in row.text and instant.replace("T", " ") in row.text, row.text
    browser.save_screenshot(str(shots / f"{admin.name}-runs-stuck.png"))

    browser.get(base + admin.replicas)
    wait_for(browser, "tbody tr")
    assert "clock offset" in dict(browser.execute_script(_HEADINGS))
    assert f"{LIVE.clock_offset:+.3f} s" in browser.find_element(By.TAG_NAME, "body").text

    browser.get(base + admin.runs)
    click(browser, admin.to_schedules)
    wait_for(browser, "tr[data-schedule]")
    shown = browser.find_elements(By.CSS_SELECTOR, "tr[data-schedule]")
    assert len(shown) == len({r["schedule"] for r in seeded.rows})
    browser.save_screenshot(str(shots / f"{admin.name}-schedules.png"))


def test_django_admin_in_chromium(
    browser: Any, seeded: Seeded, workdir: Path, procs: ProcessSet, screenshots: Path
) -> None:
    site = django_site(seeded, workdir / "django-browser", procs, "postgresql")
    walk(browser, site.base, "viewer", DJANGO, seeded, screenshots)


def test_sqladmin_in_chromium(
    browser: Any, seeded: Seeded, workdir: Path, procs: ProcessSet, screenshots: Path
) -> None:
    root = workdir / "sqladmin-browser"
    root.mkdir()
    site = SqladminSite.start(
        root, procs, seeded.store_url, args=("--celery-app", APP), env=seeded.env
    )
    walk(browser, site.base, str(site.user), SQLADMIN, seeded, screenshots)
    # sqladmin's own index is an empty page: this admin opens on the schedules overview.
    browser.get(site.base + "/admin/")
    wait_for(browser, "tr[data-schedule]")
    assert browser.current_url == site.base + "/admin/schedules"
