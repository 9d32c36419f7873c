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
    services = _compose()["services"]
    for name in SERVICES:  # dayzero's own services (the observability images have their own variables)
        for key in services[name].get("environment", {}):
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


def test_observability_profile_dashboard_and_scrape_config_are_valid():
    import json
    import re

    services = _compose()["services"]
    for name in ("otel-collector", "jaeger", "prometheus", "grafana"):
        assert services[name]["profiles"] == ["observability"]
        for volume in services[name].get("volumes", []):
            assert (ROOT / volume.split(":")[0]).exists(), volume
    obs = ROOT / "docker" / "observability"
    scrape = yaml.safe_load((obs / "prometheus.yml").read_text())
    job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "dayzero")
    assert job["static_configs"][0]["targets"] == ["gateway:8000"] and job["metrics_path"] == "/metrics"
    collector = yaml.safe_load((obs / "otel-collector.yaml").read_text())
    pipeline = collector["service"]["pipelines"]["traces"]
    assert set(pipeline["receivers"]) <= set(collector["receivers"])
    assert set(pipeline["exporters"]) <= set(collector["exporters"])
    dashboard = json.loads((obs / "grafana" / "dashboards" / "dayzero.json").read_text())
    documented = set(re.findall(r"`(dayzero_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    titles = {p["title"] for p in dashboard["panels"]}
    assert {
        "Time to first token",
        "Inter-token latency",
        "Throughput",
        "Queue depth per stage",
        "Attention-pool usage",
        "Expert cache hit rate",
    } <= titles
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "prometheus" and panel["targets"]
        for target in panel["targets"]:
            for name in re.findall(r"dayzero_[a-z_]+", target["expr"]):
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                assert base in documented, f"{panel['title']}: {name} is not a documented metric"
    datasource = yaml.safe_load((obs / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["uid"] == "prometheus"
