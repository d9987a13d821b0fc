"""Settings parsing: defaults, environment fallback, and errors that name the setting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from voltro_beat.config import DEFAULT_STORE_URL, Settings
from voltro_beat.exceptions import ConfigurationError


def test_defaults() -> None:
    s = Settings.from_config({}, environ={})
    assert s.store_url == DEFAULT_STORE_URL
    assert s.coordination == "advisory_lock"
    assert s.max_lateness == timedelta(days=1)
    assert s.claims_ttl == timedelta(hours=24)
    assert s.runs_ttl == timedelta(days=30)
    assert s.migrate is True
    assert s.timezone is None


def test_config_wins_over_environment() -> None:
    env = {"VOLTRO_BEAT_STORE_URL": "sqlite:///env.db", "VOLTRO_BEAT_REPLICA": "from-env"}
    s = Settings.from_config({"voltro_beat_store_url": "sqlite:///conf.db"}, environ=env)
    assert s.store_url == "sqlite:///conf.db"
    assert s.replica == "from-env"


def test_spec_environment_names_for_retention() -> None:
    env = {"VOLTRO_SCHEDULE_CLAIMS_TTL_HOURS": "2", "VOLTRO_SCHEDULE_RUNS_TTL_HOURS": "48"}
    s = Settings.from_config({}, environ=env)
    assert (s.claims_ttl, s.runs_ttl) == (timedelta(hours=2), timedelta(hours=48))


@pytest.mark.parametrize("alias", ["advisoryLock", "wonLock", "advisory_lock"])
def test_coordination_aliases(alias: str) -> None:
    s = Settings.from_config({"voltro_beat_coordination": alias}, environ={})
    assert s.coordination == "advisory_lock"


@pytest.mark.parametrize(
    ("conf", "setting"),
    [
        ({"voltro_beat_coordination": "leader"}, "voltro_beat_coordination"),
        ({"voltro_beat_coordination": "cluster"}, "voltro_beat_coordination"),
        ({"voltro_beat_max_lateness": 0}, "voltro_beat_max_lateness"),
        ({"voltro_beat_max_lateness": "soon"}, "voltro_beat_max_lateness"),
        ({"voltro_beat_store_url": ""}, "voltro_beat_store_url"),
        ({"voltro_beat_migrate": "perhaps"}, "voltro_beat_migrate"),
        ({"voltro_beat_claims_ttl_hours": -1}, "voltro_beat_claims_ttl_hours"),
        ({"voltro_beat_publish_timeout": 3}, "voltro_beat_publish_timeout"),
        (
            {"voltro_beat_publish_timeout": 15, "broker_connection_timeout": 10},
            "voltro_beat_publish_timeout",
        ),
        # The run row is the long fence: it must outlive max_lateness.
        (
            {"voltro_beat_runs_ttl_hours": 24, "voltro_beat_max_lateness": 2 * 86400},
            "voltro_beat_runs_ttl_hours",
        ),
    ],
)
def test_bad_values_name_the_setting(conf: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_config(conf, environ={})
    assert info.value.field == setting
    assert setting in str(info.value)


def test_timezone_as_celery_resolves_it() -> None:
    from celery import Celery

    app = Celery("tz", set_as_current=False)
    assert Settings.from_config(app.conf, environ={}).timezone is None  # UTC
    app.conf.timezone = "Europe/Berlin"
    assert Settings.from_config(app.conf, environ={}).timezone == "Europe/Berlin"
    # Django's setting name, read by Celery's conf.timezone accessor when timezone is unset.
    django_style = Celery("tz", set_as_current=False)
    django_style.conf.update(TIME_ZONE="US/Pacific")
    assert Settings.from_config(django_style.conf, environ={}).timezone == "US/Pacific"


def test_enable_utc_off_without_timezone_is_the_hosts_zone() -> None:
    import tzlocal
    from celery import Celery

    app = Celery("tz", set_as_current=False)
    app.conf.enable_utc = False
    assert Settings.from_config(app.conf, environ={}).timezone == tzlocal.get_localzone_name()


@pytest.mark.parametrize("zone", ["Europe/Pariss", "UTC+2", "../etc/passwd"])
def test_an_unknown_app_time_zone_names_the_setting(zone: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_config({"timezone": zone}, environ={})
    assert info.value.field == "timezone"
    assert f"unknown time zone {zone!r}" in str(info.value)
