"""Both admins in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, Selenium):
log in, open the runs list, filter by ``failed``, open a run, open the schedules overview.

Each step saves a screenshot (``conftest.screenshots``); docs/admin.md shows them, refreshed
with ``VBT_SCREENSHOTS=docs/images .venv/bin/python -m pytest tests/contrib/test_browser.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_sites import PASSWORD, SqladminSite
from conftest import APP, Seeded, django_site
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


def log_in(browser: Any, url: str, user: str, submit: str) -> None:
    browser.get(url)
    wait_for(browser, "input[name=username]").send_keys(user)
    browser.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(PASSWORD)
    click(browser, submit)


def test_django_admin_in_chromium(
    browser: Any, seeded: Seeded, workdir: Path, procs: ProcessSet, screenshots: Path
) -> None:
    site = django_site(seeded, workdir / "django-browser", procs, "postgresql")
    log_in(browser, f"{site.base}/admin/login/", "viewer", "input[type=submit]")
    wait_for(browser, "#user-tools")

    browser.get(f"{site.base}/admin/voltro_beat/run/")
    wait_for(browser, "#result_list")
    browser.save_screenshot(str(screenshots / "django-runs.png"))

    click(browser, '#changelist-filter a[href*="status__exact=failed"]')
    wait_for(browser, '#changelist-filter li.selected a[href*="status__exact=failed"]')
    statuses = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "td.field-status_badge")}
    assert statuses == {"failed"}
    browser.save_screenshot(str(screenshots / "django-runs-failed.png"))

    click(browser, "#result_list th.field-id a")
    wait_for(browser, "fieldset")
    assert "ValueError: boom" in browser.page_source
    assert "FAILURE" in browser.page_source  # the link to django-celery-results' result
    browser.save_screenshot(str(screenshots / "django-run.png"))

    browser.get(f"{site.base}/admin/voltro_beat/run/")
    click(browser, ".object-tools a")
    wait_for(browser, ".vb-overview")
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-schedule]")) == len(
        {r["schedule"] for r in seeded.rows}
    )
    browser.save_screenshot(str(screenshots / "django-schedules.png"))


def test_sqladmin_in_chromium(
    browser: Any, seeded: Seeded, workdir: Path, procs: ProcessSet, screenshots: Path
) -> None:
    root = workdir / "sqladmin-browser"
    root.mkdir()
    site = SqladminSite.start(
        root, procs, seeded.store_url, args=("--celery-app", APP), env=seeded.env
    )
    log_in(browser, f"{site.base}/admin/login", str(site.user), "button[type=submit]")
    wait_for(browser, "#navbar-menu")

    browser.get(f"{site.base}/admin/run/list")
    wait_for(browser, "table")
    browser.save_screenshot(str(screenshots / "sqladmin-runs.png"))

    click(browser, 'a[href*="status=failed"]')
    WebDriverWait(browser, 20).until(expected_conditions.url_contains("status=failed"))
    badges = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "tbody .badge")}
    assert badges == {"failed"}
    browser.save_screenshot(str(screenshots / "sqladmin-runs-failed.png"))

    click(browser, 'tbody a[href*="/admin/run/details/"]')
    wait_for(browser, "pre")
    assert "ValueError: boom" in browser.page_source
    browser.save_screenshot(str(screenshots / "sqladmin-run.png"))

    click(browser, 'a[href$="/admin/schedules"]')
    wait_for(browser, "tr[data-schedule]")
    browser.save_screenshot(str(screenshots / "sqladmin-schedules.png"))
