"""docker-compose.yml (no Docker engine here): parsed, and held to what `dayzero up` runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from dayzero.settings import Settings
from dayzero.stack import SERVICES, service_argv

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_each_service_runs_the_entry_point_dayzero_up_runs():
    services = _compose()["services"]
    for name in SERVICES:
        assert services[name]["command"] == ["dayzero", *service_argv(name)]
        dockerfile = ROOT / services[name]["build"]["dockerfile"]
        assert f'CMD ["dayzero", "serve", "{name}"]' in dockerfile.read_text()
        assert dockerfile.read_text().splitlines()[1] == "FROM base"  # the common base image


def test_every_environment_variable_is_a_known_setting():
    known = {f"DAYZERO_{field.upper()}" for field in Settings.model_fields}
    for name, service in _compose()["services"].items():
        for key in service.get("environment", {}):
            assert key in known, f"{name}: {key} is not a dayzero setting"


def test_workers_have_gpus_replicas_healthchecks_and_shared_memory():
    services = _compose()["services"]
    for name in ("vision", "prefill", "decode"):
        deploy = services[name]["deploy"]
        assert deploy["replicas"] >= 1
        assert deploy["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        assert services[name]["ipc"] == "host" and services[name]["shm_size"]
    for name in ("redis", *SERVICES):
        assert services[name]["healthcheck"]["test"]
    assert services["gateway"]["depends_on"]["redis"]["condition"] == "service_healthy"
