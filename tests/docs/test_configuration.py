"""docs/configuration.md against the code: every setting ``Settings.from_config`` reads, with
its environment variable, has its row; every row names a setting the code reads; every
``VOLTRO_*`` name in the package is documented on the page."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from voltro_beat import config
from voltro_beat.config import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "configuration.md").read_text()


def settings_in_code() -> dict[str, str]:
    """``{setting: environment variable}`` from the ``get(...)`` calls of ``from_config``."""
    tree = ast.parse(Path(config.__file__).read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "get":
            key, env = node.args[0], node.args[1]
            assert isinstance(key, ast.Constant) and isinstance(env, ast.Constant)
            found[key.value] = env.value
    return found


def settings_in_page() -> dict[str, str]:
    """``{setting: environment variable}`` from the table rows of the page."""
    return dict(re.findall(r"^\| `(voltro_beat_\w+)` \| `(VOLTRO_\w+)` \|", PAGE, flags=re.M))


def test_every_setting_of_the_code_has_its_row_and_every_row_a_setting() -> None:
    code = settings_in_code()
    assert len(code) == len(fields(Settings)) - 1  # all but the app's own `timezone`
    assert settings_in_page() == code


def test_every_voltro_environment_name_of_the_package_is_on_the_page() -> None:
    names = set()
    for path in (ROOT / "voltro_beat").rglob("*.py"):
        names |= set(re.findall(r"[\"'](VOLTRO_[A-Z_]+)[\"']", path.read_text()))
    assert names, "no VOLTRO_* name found: the pattern is wrong"
    missing = sorted(name for name in names if f"`{name}`" not in PAGE)
    assert not missing, f"docs/configuration.md does not mention {missing}"
