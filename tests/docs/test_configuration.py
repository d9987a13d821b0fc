"""docs/configuration.md against the code: every setting of ``config.SETTINGS``, with its
environment variable, has its row; every row names a setting the code reads; the precedence
the page states is the code's; every ``VOLTRO_*`` name in the package is documented on the
page."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from voltro_beat.config import SETTINGS, Origin, Settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "configuration.md").read_text()


def settings_in_code() -> dict[str, str]:
    """``{setting: environment variable}`` from the table of ``config.SETTINGS``."""
    return {setting.key: setting.env for setting in SETTINGS}


def settings_in_page() -> dict[str, str]:
    """``{setting: environment variable}`` from the table rows of the page."""
    return dict(re.findall(r"^\| `(voltro_beat_\w+)` \| `(VOLTRO_\w+)` \|", PAGE, flags=re.M))


def test_every_setting_of_the_code_has_its_row_and_every_row_a_setting() -> None:
    # Every field but the app's own `timezone` (and the record of sources) has its row.
    assert {s.field for s in SETTINGS} == {f.name for f in fields(Settings)} - {
        "timezone",
        "sources",
    }
    assert settings_in_page() == settings_in_code()


def test_the_page_states_the_codes_precedence() -> None:
    section = PAGE.split("## Where a setting comes from", 1)[1].split("\n## ", 1)[0]
    order = re.search(r"explicit flag > environment variable > app setting > default", section)
    assert order, "the section does not state the order"
    assert list(Origin) == [Origin.FLAG, Origin.ENVIRONMENT, Origin.APP, Origin.DEFAULT]


def test_every_voltro_environment_name_of_the_package_is_on_the_page() -> None:
    names = set()
    for path in (ROOT / "voltro_beat").rglob("*.py"):
        names |= set(re.findall(r"[\"'](VOLTRO_[A-Z_]+)[\"']", path.read_text()))
    assert names, "no VOLTRO_* name found: the pattern is wrong"
    missing = sorted(name for name in names if f"`{name}`" not in PAGE)
    assert not missing, f"docs/configuration.md does not mention {missing}"
