"""Real admin servers over a voltro_beat store, for the admin tests and ``bench/admin.py``.

* :class:`DjangoSite`: a project made by ``django-admin startproject`` with
  ``voltro_beat.contrib.django`` installed, migrated, with users, served by ``runserver``;
* :class:`SqladminSite`: ``voltro-beat admin`` (uvicorn), logins from the environment.

Each server is a subprocess in its own process group (``vbt_harness.ProcessSet``); the
clients are plain ``httpx`` clients that log in as a browser would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
ACCEPTANCE = ROOT / "tests" / "acceptance"
sys.path.insert(0, str(ACCEPTANCE))

from vbt_harness import Proc, ProcessSet, free_port  # noqa: E402

VENV_BIN = Path(sys.executable).parent
PASSWORD = "not-a-default-Pa55"
#: The users every Django site has: (name, staff, superuser, permissions).
USERS = {
    "admin": (True, True, ()),
    "viewer": (
        True,
        False,
        ("view_run", "view_claim", "view_replica", "view_shard", "view_singletonstate"),
    ),
    "staff": (True, False, ()),
    "outsider": (False, False, ("view_run",)),
}


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOLTRO_", "DJANGO_"))}
    env["PYTHONPATH"] = os.pathsep.join((str(ACCEPTANCE), str(ROOT)))
    env.update(extra)
    return env


def wait_answering(url: str, proc: Proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"{proc.name} does not answer at {url}:\n{proc.tail()}")


@dataclass
class Site:
    """A running admin server."""

    base: str
    proc: Proc

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30)


@dataclass
class DjangoSite(Site):
    workdir: Path = field(default_factory=Path)
    env: dict[str, str] = field(default_factory=dict)
    time_zone: str = "UTC"
    #: The voltro_beat store the site reads (the seeded one, or its SQLite copy).
    store_url: str = ""

    @classmethod
    def create(
        cls,
        workdir: Path,
        procs: ProcessSet,
        *,
        databases: Mapping[str, Mapping[str, Any]],
        settings: Mapping[str, Any],
        env: Mapping[str, str] = {},
    ) -> DjangoSite:
        """Make, migrate and serve a project whose settings add ``settings`` to the defaults."""
        workdir.mkdir(parents=True, exist_ok=True)
        environ = _environment({**env, "DJANGO_SETTINGS_MODULE": "site_settings.settings"})
        subprocess.run(
            [str(VENV_BIN / "django-admin"), "startproject", "site_settings", str(workdir)],
            check=True,
            env=environ,
        )
        lines = [
            'INSTALLED_APPS += ["voltro_beat.contrib.django", "django_celery_results"]',
            'ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]',
            f"DATABASES = {dict(databases)!r}",
            *(f"{name} = {value!r}" for name, value in settings.items()),
        ]
        with (workdir / "site_settings" / "settings.py").open("a") as out:
            out.write("\n" + "\n".join(lines) + "\n")
        port = free_port()
        proc = procs.start(
            "django",
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=environ,
            cwd=workdir,
            log=workdir / "runserver.log",
        )
        site = cls(
            base=f"http://127.0.0.1:{port}",
            proc=proc,
            workdir=workdir,
            env=environ,
            time_zone=str(settings.get("TIME_ZONE", "UTC")),
        )
        site.manage("migrate", "--noinput", "-v", "0")
        site.shell(_CREATE_USERS.format(users=USERS, password=PASSWORD))
        wait_answering(site.base + "/admin/login/", proc)
        return site

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def shell(self, code: str) -> str:
        """Run ``code`` in ``manage.py shell``; returns what it printed."""
        return self.manage("shell", "-c", code)

    def login(self, user: str) -> httpx.Client:
        """A client logged in through the admin's login form as ``user``."""
        client = self.client()
        form = client.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text
        done = client.post(
            "/admin/login/?next=/admin/",
            data={
                "csrfmiddlewaretoken": token.group(1),
                "username": user,
                "password": PASSWORD,
                "next": "/admin/",
            },
        )
        assert done.status_code == 302, f"login of {user} failed: {done.status_code}"
        return client

    def session_of(self, user: str) -> httpx.Client:
        """A client with a session of ``user`` made outside the admin's login (which a
        non-staff user cannot pass), as another part of the site would make it."""
        key = self.shell(_SESSION.format(user=user)).strip().splitlines()[-1]
        client = self.client()
        client.cookies.set("sessionid", key)
        return client


# Idempotent: two projects may share one PostgreSQL database.
_CREATE_USERS = """
from django.contrib.auth.models import Permission, User
for name, (staff, superuser, permissions) in {users!r}.items():
    user, _ = User.objects.update_or_create(
        username=name, defaults=dict(is_staff=staff, is_superuser=superuser)
    )
    user.set_password({password!r})
    user.save()
    user.user_permissions.set(Permission.objects.filter(codename__in=permissions))
"""

_SESSION = """
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
user = User.objects.get(username={user!r})
session = SessionStore()
session[SESSION_KEY] = str(user.pk)
session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print(session.session_key)
"""


@dataclass
class SqladminSite(Site):
    user: str | None = None

    @classmethod
    def start(
        cls,
        workdir: Path,
        procs: ProcessSet,
        store_url: str,
        *,
        args: tuple[str, ...] = (),
        env: Mapping[str, str] = {},
        user: str | None = "operator",
    ) -> SqladminSite:
        """``voltro-beat admin`` over ``store_url``, with a login of ``user`` (None: none)."""
        port = free_port()
        credentials = (
            {}
            if user is None
            else {
                "VOLTRO_BEAT_ADMIN_USER": user,
                "VOLTRO_BEAT_ADMIN_PASSWORD": PASSWORD,
            }
        )
        proc = procs.start(
            "voltro-beat-admin",
            admin_command(store_url, "--port", str(port), *args),
            env=_environment({**env, **credentials}),
            cwd=workdir,
            log=workdir / f"admin-{port}.log",
        )
        site = cls(base=f"http://127.0.0.1:{port}", proc=proc, user=user)
        wait_answering(site.base + "/admin/login", proc)
        return site

    def login(self, password: str = PASSWORD) -> httpx.Client:
        client = self.client()
        done = client.post("/admin/login", data={"username": self.user, "password": password})
        assert done.status_code == 302, done.status_code
        return client


def admin_command(store_url: str, *args: str) -> list[str]:
    return [str(VENV_BIN / "voltro-beat"), "admin", "--store", store_url, *args]


def run_admin_command(
    store_url: str,
    *args: str,
    env: Mapping[str, str] = {},
) -> subprocess.CompletedProcess[str]:
    """Run ``voltro-beat admin`` to its end (a refusal to start), with a time limit."""
    return subprocess.run(
        admin_command(store_url, *args),
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
