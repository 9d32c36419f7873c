"""docker-compose.yml (no Docker engine here): parsed, and held to what `dayzero up` runs."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import yaml
from celery import Celery

from dayzero.cli import parser
from dayzero.redis_urls import sentinel_address
from dayzero.service_commands import SERVICES, service_argv
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_each_service_runs_the_entry_point_dayzero_up_runs():
    services = _compose()["services"]
    for name in SERVICES:
        ranks = len(_gpus(services[name])) if name in ("prefill", "decode") else 1
        assert services[name]["command"] == ["dayzero", *service_argv(name, ranks)]
        dockerfile = ROOT / services[name]["build"]["dockerfile"]
        assert f'CMD ["dayzero", "serve", "{name}"]' in dockerfile.read_text()
        assert dockerfile.read_text().splitlines()[1] == "FROM base"  # the common base image


def test_every_environment_variable_is_a_known_setting():
    known = {f"DAYZERO_{field.upper()}" for field in Settings.model_fields}
    services = _compose()["services"]
    for name in SERVICES:  # dayzero's own services (the observability images have their own variables)
        for key in services[name].get("environment", {}):
            assert key in known, f"{name}: {key} is not a dayzero setting"


def _workers(services: dict) -> dict[str, dict]:
    """Every container that runs a worker stage (``dayzero serve <stage> ...``)."""
    stages = (["vision"], ["prefill"], ["decode"])
    return {
        n: svc
        for n, svc in services.items()
        if svc.get("command", [])[1:2] == ["serve"] and svc["command"][2:3] in stages
    }


def _gpus(service: dict) -> list[str]:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and "count" not in device  # named GPUs, not "any N"
    return device["device_ids"]


def _ranks(service: dict) -> int:
    command = service["command"]
    return int(command[command.index("--tensor-parallel") + 1]) if "--tensor-parallel" in command else 1


def test_each_worker_computes_on_its_own_gpus_with_a_handoff_that_fits():
    services = _compose()["services"]
    workers = _workers(services)
    assert {svc["command"][2] for svc in workers.values()} == {"vision", "prefill", "decode"}
    owner: dict[str, str] = {}
    for name, svc in workers.items():
        env = svc["environment"]
        assert env["DAYZERO_DEVICE"].startswith("cuda"), f"{name} would compute on CPU"
        Settings(
            device=env["DAYZERO_DEVICE"],
            handoff=env["DAYZERO_HANDOFF"],
            attention_backend=env["DAYZERO_ATTENTION_BACKEND"],
        )  # a combination that can start
        gpus = _gpus(svc)
        assert _ranks(svc) == len(gpus), f"{name}: one rank per GPU"
        assert svc["ipc"] == "host"  # NCCL between the ranks, the Redis-free paths (shm_size is moot then)
        if svc["command"][2] == "vision":
            continue  # the small tower may sit beside a model shard
        for gpu in gpus:
            assert owner.setdefault(gpu, name) == name, f"{name} shares GPU {gpu} with {owner[gpu]}"
    assert sorted(owner, key=int) == [str(i) for i in range(8)]  # all eight GPUs of the host hold a shard
    stages = {svc["command"][2]: set(_gpus(svc)) for svc in workers.values()}
    if stages["prefill"] != stages["decode"]:  # CUDA IPC cannot cross GPUs
        assert {s["environment"]["DAYZERO_HANDOFF"] for s in workers.values()} == {"redis"}


def _settings(service: dict) -> Settings:
    """The settings a worker container runs with (its environment; compose's ${...} defaults aside)."""
    env = service["environment"]
    return Settings(**{k.removeprefix("DAYZERO_").lower(): v for k, v in env.items() if "${" not in str(v)})


def test_the_groups_split_and_fit_deepseek_v4_flash_on_h200s():
    """Each group's pools too: under a DAYZERO_KV_BUDGET_MB of 256 (the default once) a worker refused to start,
    the windows of DAYZERO_MAX_BATCH V4-Flash sequences being more than the budget (18 MiB each in bf16:
    the window ring and the compressors' state), and the plan, which left the budget out, said they fit."""
    from dayzero.quant.inspect import inspect

    for name, svc in _workers(_compose()["services"]).items():
        if svc["command"][2] in ("prefill", "decode"):  # inspect refuses a size that does not split the model
            settings = _settings(svc)
            report = inspect("deepseek-v4-flash", 1, 65536, 1, 0.0, _ranks(svc), settings)
            kv, tp = report.kv_pools, report.tensor_parallel
            assert "refused" not in kv, f"{name}: {kv['refused']}"
            assert kv["capacity_tokens"] >= settings.max_context  # what `up` asks of a worker's pools
            assert tp["gib_per_rank"]["attention_state_replicated"] * (1 << 30) >= kv["bytes"] * 0.999
            assert tp["fits_h200"], f"{name}: {tp['total_gib_per_rank']} GiB per rank"
            assert _ranks(svc) >= tp["smallest_fitting_h200_group"]


def test_restart_policies_and_healthchecks_that_test_their_own_container():
    services = _compose()["services"]
    for name in ("redis", "gateway", *_workers(services)):
        assert services[name]["restart"] in ("unless-stopped", "always"), name
        assert services[name]["healthcheck"]["test"], name
    assert "127.0.0.1" in " ".join(services["gateway"]["healthcheck"]["test"])
    for name, svc in _workers(services).items():
        kind, check = svc["healthcheck"]["test"]
        stage = svc["command"][2]
        assert kind == "CMD-SHELL" and "inspect ping" in check and f"-d {stage}@$$(hostname)" in check, name
        alive = check.split(" && ")[0].split()  # its liveness stamps too: a frozen loop still answers a ping
        assert alive[:2] == ["dayzero", "alive"] and parser().parse_args(alive[1:]).stage == stage, name
    assert services["gateway"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "does not restart" in (ROOT / "README.md").read_text()  # what an unhealthy worker needs


def _celery_cli_app(argv: list[str]) -> Celery:
    """The app Celery's command line ``argv`` runs with: ``-A module``'s, or one on ``-b URL``'s broker."""
    if "-A" in argv:
        return importlib.reload(importlib.import_module(argv[argv.index("-A") + 1])).app
    return Celery(broker=os.path.expandvars(argv[argv.index("-b") + 1].replace("$$", "$")))


@pytest.mark.parametrize("url", ["redis+sentinel://s1:26379,s2/dz/0", "rediss://h:6380/0", "redis://redis:6379/0"])
def test_a_workers_celery_ping_reaches_its_broker_as_the_worker_does(monkeypatch, url):
    """``celery -b $$DAYZERO_REDIS_URL`` read a redis+sentinel:// URL as kombu's plain redis transport
    (the sentinel asked as the Redis, "dz" as the database: each worker unhealthy where it served) and
    a rediss:// one with kombu's transport and TLS defaults (CERT_NONE). The ping's broker is the
    workers' own now, whatever the URL."""
    monkeypatch.setenv("DAYZERO_REDIS_URL", url)
    served = make_celery(Settings(redis_url=url)).connection_for_write()
    for name, svc in _workers(_compose()["services"]).items():
        ping = svc["healthcheck"]["test"][1].split(" && ")[1].split()
        pinged = _celery_cli_app(ping).connection_for_write()
        assert (pinged.transport_cls, pinged.alt, pinged.transport_options) == (
            served.transport_cls,
            served.alt,
            served.transport_options,
        ), name


def test_the_image_carries_a_cuda_build_of_the_pinned_torch():
    import re

    base = (ROOT / "docker" / "base.Dockerfile").read_text()
    pin = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert re.search(rf"--index-url https://download.pytorch.org/whl/cu\d+ torch=={re.escape(pin)}", base)
    assert base.index("download.pytorch.org") < base.index("RUN pip install .")  # before the package's deps


def test_the_checkpoint_has_a_documented_way_in():
    compose = (ROOT / "docker-compose.yml").read_text()
    readme = (ROOT / "README.md").read_text()
    for text in (compose, readme):
        assert "--local-dir ./checkpoint" in text and "dayzero demo-checkpoint ./checkpoint" in text
    assert all(
        "${DAYZERO_CHECKPOINT_DIR:-./checkpoint}:/checkpoint:ro" in svc["volumes"]
        for svc in _workers(_compose()["services"]).values()
    )


def test_the_gateway_serves_the_downloaded_model_by_its_id_unless_told_otherwise():
    """Compose set no DAYZERO_MODEL_NAME: clients of a V4-Flash deployment had to send
    ``model: dayzero-demo``, the demo's name. Now the id of the repository the compose file and the
    README download (what vLLM and SGLang serve it as), which DAYZERO_MODEL_NAME from the shell overrides."""
    import re

    compose = (ROOT / "docker-compose.yml").read_text()
    (downloaded,) = set(re.findall(r"huggingface-cli download (\S+) --local-dir", compose))
    assert f"huggingface-cli download {downloaded} --local-dir" in (ROOT / "README.md").read_text()
    served = _compose()["services"]["gateway"]["environment"]["DAYZERO_MODEL_NAME"]
    assert served == f"${{DAYZERO_MODEL_NAME:-{downloaded}}}"


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
    (job,) = scrape["scrape_configs"]  # the gateway's scrape carries the workers' metrics: nothing twice
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


def test_the_trace_endpoint_reaches_the_collector_on_the_port_of_either_exporter():
    """Compose set ``http://otel-collector:4317`` whatever the exporter: otlp-http posted its spans to
    the collector's gRPC port. Each service's endpoint, as dayzero reads it, is the collector's
    receiver of the exporter's protocol (its own config's port)."""
    from urllib.parse import urlsplit

    from dayzero.telemetry import collector_url

    receivers = yaml.safe_load((ROOT / "docker" / "observability" / "otel-collector.yaml").read_text())
    protocols = receivers["receivers"]["otlp"]["protocols"]
    services = _compose()["services"]
    for name in SERVICES:
        endpoint = services[name]["environment"]["DAYZERO_TRACE_ENDPOINT"]
        for exporter, protocol in (("otlp-grpc", "grpc"), ("otlp-http", "http")):
            url = urlsplit(collector_url(exporter, endpoint))
            assert url.hostname == "otel-collector" and f"{url.port}" == protocols[protocol]["endpoint"].split(":")[1]


def test_the_sentinel_override_puts_every_service_on_its_sentinels():
    """docker/sentinel.compose.yml (no example of Sentinel under compose before): each dayzero service's
    URL is a redis+sentinel:// one that Settings takes, naming every sentinel it adds and the master
    name they monitor, the master docker-compose.yml's own ``redis``."""
    services = _compose()["services"]
    override = yaml.safe_load((ROOT / "docker" / "sentinel.compose.yml").read_text())["services"]
    sentinels = sorted(name for name, svc in override.items() if "--sentinel" in svc.get("command", [""])[-1])
    assert len(sentinels) >= 3  # (a quorum that outlives one sentinel's loss)
    for name in SERVICES:
        where = sentinel_address(Settings(redis_url=override[name]["environment"]["DAYZERO_REDIS_URL"]).redis_url)
        assert sorted(host for host, _ in where.sentinels) == sentinels, name
        assert set(override[name]["depends_on"]) == set(sentinels), name
    for name in sentinels:
        monitor = override[name]["command"][-1].split("sentinel monitor ")[1].split()
        assert monitor[:3] == [where.master_name, "redis", "6379"] and "redis" in services, name
    assert override["redis-replica"]["command"][1:4] == ["--replicaof", "redis", "6379"]
