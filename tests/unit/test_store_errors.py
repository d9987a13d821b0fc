"""Which store errors no retry cures (voltro_beat.store.database.PERMANENT): by the server's
SQLSTATE, with psycopg's own error classes as SQLAlchemy wraps them, and by the message
libpq gives for a connection the server refused (it carries no SQLSTATE).

The real server's refusals (an unknown database, role or host, a missing grant) are in
tests/integration/test_store_boot.py; this server trusts local connections, so the wrong
password is only here.
"""

from __future__ import annotations

import pytest
from psycopg import errors
from sqlalchemy.exc import OperationalError, ProgrammingError

from voltro_beat.store.database import Database


@pytest.fixture
def database() -> Database:
    return Database.open("postgresql+psycopg://app:s3cret@db.example:5432/app")


@pytest.mark.parametrize(
    ("error", "check"),
    [
        (errors.InvalidPassword("password authentication failed"), "password in the URL"),
        (errors.InvalidAuthorizationSpecification("no entry"), "the user name in the URL"),
        (errors.InvalidCatalogName("no such database"), "the database name in the URL"),
        (errors.InsufficientPrivilege("permission denied"), "the role's grants"),
    ],
)
def test_permanent_by_sqlstate(database: Database, error: Exception, check: str) -> None:
    failure = database.error(ProgrammingError("SELECT 1", {}, error))
    assert failure.check is not None and check in failure.check
    assert str(failure).startswith("store postgresql+psycopg://app:***@db.example:5432/app: ")
    assert "s3cret" not in str(failure)


@pytest.mark.parametrize(
    ("message", "check"),
    [
        (
            'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  '
            'password authentication failed for user "app"',
            "password in the URL",
        ),
        (
            'connection failed: ... FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app"',
            "pg_hba.conf",
        ),
        ("failed to resolve host 'db.exmaple': [Errno -2] Name or service not known", "host name"),
    ],
)
def test_permanent_by_the_refusal_message(database: Database, message: str, check: str) -> None:
    failure = database.error(OperationalError(None, None, errors.OperationalError(message)))
    assert failure.check is not None and check in failure.check


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: Connection '
        "refused",
        "connection failed: ... FATAL:  the database system is starting up",
        "consuming input failed: server closed the connection unexpectedly",
        "connection timeout expired",
    ],
)
def test_a_server_down_or_restarting_is_transient(database: Database, message: str) -> None:
    assert (
        database.error(OperationalError(None, None, errors.OperationalError(message))).check is None
    )


def test_an_error_raised_by_the_server_with_another_sqlstate_is_transient(
    database: Database,
) -> None:
    shutting_down = errors.AdminShutdown("terminating connection due to administrator command")
    assert database.error(OperationalError(None, None, shutting_down)).check is None
