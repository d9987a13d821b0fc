"""Settings: the precedence (flag > environment > app setting > default) and where each value
came from, defaults, and errors that name the setting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from voltro_beat.config import DEFAULT_STORE_URL, SETTINGS, Origin, Settings, Source
from voltro_beat.exceptions import ConfigurationError


def test_defaults() -> None:
    s = Settings.resolve({}, environ={})
    assert s.store_url == DEFAULT_STORE_URL
    assert s.coordination == "advisory_lock"
    assert s.max_lateness == timedelta(days=1)
    assert s.claims_ttl == timedelta(hours=24)
    assert s.runs_ttl == timedelta(days=30)
    assert s.migrate is True
    assert s.timezone is None


def test_a_flag_wins_over_the_environment_which_wins_over_the_app() -> None:
    conf = {
        "voltro_beat_store_url": "sqlite:///app.db",
        "voltro_beat_replica": "from-app",
        "voltro_beat_max_lateness": 60,
        "voltro_beat_migrate": False,
    }
    env = {
        "VOLTRO_BEAT_STORE_URL": "sqlite:///env.db",
        "VOLTRO_BEAT_REPLICA": "from-env",
        "VOLTRO_BEAT_COORDINATION": "single",
    }
    s = Settings.resolve(conf, overrides={"store_url": "sqlite:///flag.db"}, environ=env)
    assert (s.store_url, s.replica, s.coordination) == ("sqlite:///flag.db", "from-env", "single")
    assert (s.max_lateness, s.migrate, s.claims_ttl) == (timedelta(seconds=60), False, timedelta(1))
    assert s.sources["store_url"] == Source(Origin.FLAG)
    assert s.sources["replica"] == Source(Origin.ENVIRONMENT, "VOLTRO_BEAT_REPLICA")
    assert s.sources["coordination"] == Source(Origin.ENVIRONMENT, "VOLTRO_BEAT_COORDINATION")
    assert s.sources["max_lateness"] == Source(Origin.APP, "voltro_beat_max_lateness")
    assert s.sources["claims_ttl"] == Source(Origin.DEFAULT)
    assert str(s.sources["replica"]) == "environment VOLTRO_BEAT_REPLICA"
    assert str(s.sources["migrate"]) == "app setting voltro_beat_migrate"


def test_every_setting_is_described_once_with_its_source() -> None:
    s = Settings.resolve({"timezone": "Europe/Paris"}, environ={})
    described = s.described()
    assert [key for key, _, _ in described] == [*(row.key for row in SETTINGS), "timezone"]
    assert described[-1] == ("timezone", "Europe/Paris", Source(Origin.APP, "timezone"))
    assert all(source == Source(Origin.DEFAULT) for _, _, source in described[:-1])


def test_an_explicit_none_turns_off_what_is_off_by_default() -> None:
    conf = {"voltro_beat_metrics_port": 9108, "voltro_beat_health_file": "/tmp/h"}
    env = {"VOLTRO_BEAT_METRICS_PORT": "9109"}
    s = Settings.resolve(conf, overrides={"metrics_port": None, "health_file": None}, environ=env)
    assert (s.metrics_port, s.health_file) == (None, None)
    assert s.sources["metrics_port"] == Source(Origin.FLAG)
    with pytest.raises(ValueError, match="no setting named store"):
        Settings.resolve({}, overrides={"store": "sqlite:///x.db"}, environ={})


def test_a_bad_value_from_the_environment_or_a_flag_says_where_it_came_from() -> None:
    conf = {"voltro_beat_max_lateness": 60}
    with pytest.raises(ConfigurationError) as info:
        Settings.resolve(conf, environ={"VOLTRO_BEAT_MAX_LATENESS": "soon"})
    assert info.value.field == "voltro_beat_max_lateness"
    assert str(info.value) == (
        "setting 'voltro_beat_max_lateness': expected seconds or a timedelta, got 'soon' "
        "(from environment VOLTRO_BEAT_MAX_LATENESS)"
    )
    with pytest.raises(ConfigurationError) as flag:
        Settings.resolve({}, overrides={"store_url": " "}, environ={})
    assert str(flag.value).endswith("got ' ' (from flag)")
    # The cross-checks hold whichever source each side came from.
    with pytest.raises(ConfigurationError) as crossed:
        Settings.resolve(
            {"voltro_beat_runs_ttl_hours": 24}, environ={"VOLTRO_BEAT_MAX_LATENESS": "172800"}
        )
    assert crossed.value.field == "voltro_beat_runs_ttl_hours"


def test_spec_environment_names_for_retention() -> None:
    env = {"VOLTRO_SCHEDULE_CLAIMS_TTL_HOURS": "2", "VOLTRO_SCHEDULE_RUNS_TTL_HOURS": "48"}
    s = Settings.resolve({}, environ=env)
    assert (s.claims_ttl, s.runs_ttl) == (timedelta(hours=2), timedelta(hours=48))


@pytest.mark.parametrize("alias", ["advisoryLock", "wonLock", "advisory_lock"])
def test_coordination_aliases(alias: str) -> None:
    s = Settings.resolve({"voltro_beat_coordination": alias}, environ={})
    assert s.coordination == "advisory_lock"


def test_cluster_coordination_with_its_group_and_shards() -> None:
    s = Settings.resolve(
        {"voltro_beat_coordination": "cluster", "voltro_beat_shards": "16"},
        environ={"VOLTRO_BEAT_GROUP": "billing"},
    )
    assert (s.coordination, s.group, s.shards) == ("cluster", "billing", 16)
    assert Settings.resolve({}, environ={}).group == "default"


@pytest.mark.parametrize(
    ("conf", "setting"),
    [
        ({"voltro_beat_coordination": "leader"}, "voltro_beat_coordination"),
        ({"voltro_beat_shards": 0}, "voltro_beat_shards"),
        ({"voltro_beat_shards": "many"}, "voltro_beat_shards"),
        ({"voltro_beat_shards": 5000}, "voltro_beat_shards"),
        ({"voltro_beat_group": " "}, "voltro_beat_group"),
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
        Settings.resolve(conf, environ={})
    assert info.value.field == setting
    assert setting in str(info.value)


def test_timezone_as_celery_resolves_it() -> None:
    from celery import Celery

    app = Celery("tz", set_as_current=False)
    assert Settings.resolve(app.conf, environ={}).timezone is None  # UTC
    app.conf.timezone = "Europe/Berlin"
    assert Settings.resolve(app.conf, environ={}).timezone == "Europe/Berlin"
    # Django's setting name, read by Celery's conf.timezone accessor when timezone is unset.
    django_style = Celery("tz", set_as_current=False)
    django_style.conf.update(TIME_ZONE="US/Pacific")
    assert Settings.resolve(django_style.conf, environ={}).timezone == "US/Pacific"


def test_enable_utc_off_without_timezone_is_the_hosts_zone() -> None:
    import tzlocal
    from celery import Celery

    app = Celery("tz", set_as_current=False)
    app.conf.enable_utc = False
    assert Settings.resolve(app.conf, environ={}).timezone == tzlocal.get_localzone_name()


@pytest.mark.parametrize("zone", ["Europe/Pariss", "UTC+2", "../etc/passwd"])
def test_an_unknown_app_time_zone_names_the_setting(zone: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.resolve({"timezone": zone}, environ={})
    assert info.value.field == "timezone"
    assert f"unknown time zone {zone!r}" in str(info.value)
