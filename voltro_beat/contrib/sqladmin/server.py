"""The admin server of ``voltro-beat admin``: the views of :mod:`.views` in an app of their
own, behind a login whose credentials come from the environment."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from datetime import timedelta

from sqladmin.authentication import AuthenticationBackend
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import Route

from voltro_beat.contrib.display import STUCK_AFTER
from voltro_beat.contrib.sqladmin.views import VoltroAdmin, add_views
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.store.database import Database

USER_VARIABLE = "VOLTRO_BEAT_ADMIN_USER"
PASSWORD_VARIABLE = "VOLTRO_BEAT_ADMIN_PASSWORD"


class EnvironmentLogin(AuthenticationBackend):
    """One user, whose name and password are given when the server starts."""

    def __init__(self, user: str, password: str) -> None:
        # A new key per process: a restart logs everyone out, and no key is kept anywhere.
        super().__init__(secret_key=secrets.token_urlsafe(32), same_site="strict")
        self._user = user.encode()
        self._password = password.encode()

    async def login(self, request: Request) -> bool:
        form = await request.form()
        user = str(form.get("username", "")).encode()
        password = str(form.get("password", "")).encode()
        # Both compared, in constant time, whichever is wrong.
        ok = hmac.compare_digest(user, self._user) & hmac.compare_digest(password, self._password)
        if ok:
            request.session["user"] = user.decode()
        return ok

    async def logout(self, request: Request) -> bool:
        request.session.clear()
        return True

    async def authenticate(self, request: Request) -> bool:
        return request.session.get("user") == self._user.decode()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def login_from_environment(host: str, *, no_auth: bool) -> EnvironmentLogin | None:
    """The login the server at ``host`` must have: from ``VOLTRO_BEAT_ADMIN_USER`` and
    ``VOLTRO_BEAT_ADMIN_PASSWORD``, or none with ``no_auth`` on a loopback address.

    Raises :class:`ConfigurationError` for anything else: there is no default password.
    """
    if no_auth:
        if not is_loopback(host):
            raise ConfigurationError(
                f"--no-auth serves this machine only: bind to 127.0.0.1, not {host!r}",
                field="host",
            )
        return None
    user, password = os.environ.get(USER_VARIABLE), os.environ.get(PASSWORD_VARIABLE)
    if not user or not password:
        raise ConfigurationError(
            f"set {USER_VARIABLE} and {PASSWORD_VARIABLE} (there is no default password), "
            "or pass --no-auth with a loopback --host",
            field=PASSWORD_VARIABLE,
        )
    return EnvironmentLogin(user, password)


def create_app(
    store_url: str,
    login: EnvironmentLogin | None,
    *,
    celery_app: str | None = None,
    stuck_after: timedelta = STUCK_AFTER,
) -> Starlette:
    """A Starlette app serving the admin at ``/admin`` over the store at ``store_url``."""
    app = Starlette(routes=[Route("/", RedirectResponse("/admin/"))])
    admin = VoltroAdmin(
        app,
        engine=Database.open(store_url).engine,
        title="voltro_beat",
        authentication_backend=login,
    )
    add_views(admin, celery_app=celery_app, stuck_after=stuck_after, store_url=store_url)
    return app
