"""The deploy/ recipes, checked offline: the Kubernetes manifests against the Kubernetes API
schemas (kubernetes-validate ships them), the compose file against the compose specification's
JSON schema (check-jsonschema ships it), the systemd unit with ``systemd-analyze verify``, and
what each recipe must say for voltro_beat to run as documented."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from voltro_beat.schedules import parse_entries

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VENV_BIN = Path(sys.executable).parent
#: The oldest Kubernetes the manifests support (CronJob timeZone is GA since 1.27), and the
#: newest the validator knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes resource under deploy/kubernetes, by (kind, name)."""
    found = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    spec = resource["spec"]
    if resource["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: list[dict[str, Any]] = spec["template"]["spec"]["containers"]
    return result


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_kubernetes_manifests_validate_against_the_api_schemas(version: str) -> None:
    resources = manifests()
    assert len(resources) == 6
    for resource in resources.values():
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_validator_rejects_a_misspelt_field() -> None:
    """Guards the test above against a validator that accepts anything."""
    deployment = manifests()[("Deployment", "voltro-beat")]
    containers(deployment)[0]["readinesProbe"] = containers(deployment)[0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_kubernetes_recipe_runs_three_replicas_with_probes_a_budget_and_a_migration() -> None:
    resources = manifests()
    beat = resources[("Deployment", "voltro-beat")]
    assert beat["spec"]["replicas"] == 3
    (container,) = containers(beat)
    variables = env(container)
    assert variables["VOLTRO_BEAT_MIGRATE"] == "false"
    assert variables["VOLTRO_BEAT_REPLICA"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables["VOLTRO_BEAT_STORE_URL"]["secretKeyRef"]["name"] == "voltro-beat"
    health = variables["VOLTRO_BEAT_HEALTH_FILE"]
    volume = next(m["mountPath"] for m in container["volumeMounts"])
    assert Path(health).parent == Path(volume)
    for probe in ("readinessProbe", "livenessProbe"):
        assert "VOLTRO_BEAT_HEALTH_FILE" in " ".join(container[probe]["exec"]["command"])

    budget = resources[("PodDisruptionBudget", "voltro-beat")]
    assert budget["spec"]["selector"] == beat["spec"]["selector"]
    assert budget["spec"]["minAvailable"] == 2

    migrate = resources[("Job", "voltro-beat-migrate")]
    assert containers(migrate)[0]["command"] == ["voltro-beat", "db", "upgrade"]
    assert env(containers(migrate)[0])["VOLTRO_BEAT_STORE_URL"]["secretKeyRef"]["key"] == (
        "migrator-url"
    )
    worker = resources[("Deployment", "voltro-beat-worker")]
    assert env(containers(worker)[0])["VOLTRO_BEAT_MIGRATE"] == "false"
    secret = resources[("Secret", "voltro-beat")]
    assert {"store-url", "migrator-url", "broker-url"} <= secret["stringData"].keys()

    cronjob = resources[("CronJob", "voltro-beat-nightly-report")]
    command = containers(cronjob)[0]["command"]
    assert command[:2] == ["voltro-beat", "trigger"] and command[-1] == "nightly-report"
    assert cronjob["spec"]["schedule"] == "0 2 * * *"
    assert "nightly-report" in (DEPLOY / "example" / "proj.py").read_text()


def test_the_probe_command_tells_a_fresh_health_file_from_a_stale_one(tmp_path: Path) -> None:
    """The readiness probe's shell command, run as the kubelet would, on a file beat just
    touched and on one it stopped touching."""
    (container,) = containers(manifests()[("Deployment", "voltro-beat")])
    probe = container["readinessProbe"]["exec"]["command"]
    health = tmp_path / "health"
    environ = {**os.environ, "VOLTRO_BEAT_HEALTH_FILE": str(health)}
    health.touch()
    assert subprocess.run(probe, env=environ, check=False).returncode == 0
    os.utime(health, (0, 0))
    assert subprocess.run(probe, env=environ, check=False).returncode != 0
    health.unlink()
    assert subprocess.run(probe, env=environ, check=False, stderr=subprocess.DEVNULL).returncode


def test_the_compose_file_validates_against_the_compose_specification() -> None:
    compose = DEPLOY / "compose" / "compose.yaml"
    result = subprocess.run(
        [VENV_BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", compose],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_file_runs_postgres_redis_three_beats_a_worker_and_the_admin() -> None:
    services = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"]
    beats = [name for name in services if name.startswith("beat-")]
    assert len(beats) == 3
    assert {"postgres", "redis", "worker", "admin", "migrate", "roles"} <= services.keys()
    replicas = {services[b]["environment"]["VOLTRO_BEAT_REPLICA"] for b in beats}
    assert len(replicas) == 3
    for name in [*beats, "worker", "admin"]:
        assert services[name]["environment"]["VOLTRO_BEAT_MIGRATE"] == "false"
        assert "voltro_beat:" in services[name]["environment"]["VOLTRO_BEAT_STORE_URL"]
    assert services["beat-1"]["command"][3:6] == ["beat", "-S", "voltro"]
    assert services["admin"]["command"][:2] == ["voltro-beat", "admin"]
    assert services["migrate"]["command"] == ["voltro-beat", "db", "upgrade"]


def unit_settings() -> dict[str, list[str]]:
    """``Key=value`` lines of the systemd unit, by key (a key may repeat)."""
    settings: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / "voltro-beat@.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """``systemd-analyze verify`` on an instance of the template, with ExecStart pointed at
    this venv's celery (verify insists that the program exists). Where systemd-analyze is
    missing, the structural check below still runs."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; test_the_systemd_unit_says_... checks")
    text = (DEPLOY / "systemd" / "voltro-beat@.service").read_text()
    unit = tmp_path / "voltro-beat@1.service"
    unit.write_text(text.replace("/srv/proj/.venv/bin/celery", str(VENV_BIN / "celery")))
    result = subprocess.run(
        [analyze, "verify", unit], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_systemd_unit_says_how_to_stop_and_restart_beat() -> None:
    """The structural check: a clean stop long enough for the close-time publish (3 s), a
    restart on any failure, one replica name per host and instance."""
    settings = unit_settings()
    assert settings["KillSignal"] == ["SIGTERM"]
    assert int(settings["TimeoutStopSec"][0]) >= 10
    assert settings["Restart"] == ["always"]
    assert settings["ExecStart"][0].endswith("celery -A proj beat -S voltro -l info")
    assert "VOLTRO_BEAT_REPLICA=%H-%i" in settings["Environment"]
    assert settings["EnvironmentFile"] == ["/etc/voltro-beat/env"]


def test_the_example_app_loads_and_its_schedule_validates() -> None:
    """deploy/example/proj.py, the app every recipe runs. Its entry with ``"trigger":
    "external"`` is validated by the trigger's own tests (issue 13, part A); the rest here."""
    namespace = runpy.run_path(str(DEPLOY / "example" / "proj.py"))
    app = namespace["app"]
    schedule = dict(app.conf.beat_schedule)
    external = {name for name, entry in schedule.items() if entry.get("trigger") == "external"}
    assert external == {"nightly-report"}
    entries = parse_entries(
        {name: entry for name, entry in schedule.items() if name not in external},
        tz="UTC",
        max_lateness=timedelta(days=1),
    )
    assert {entry.name for entry in entries} == {"heartbeat", "digest"}
    assert "proj.ping" in app.tasks
