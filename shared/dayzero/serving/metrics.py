"""Worker metrics: each worker keeps counters and gauges in a snapshot, publishes it to Redis
with its heartbeat, and (optionally) serves it on its own port.

One scrape for the whole stack: the gateway's ``/metrics`` renders every worker's latest
snapshot from Redis (label ``worker``), next to its own request metrics. Under compose,
each worker can also be scraped directly (``DAYZERO_METRICS_PORT``); both render the same
snapshot through ``SnapshotCollector``. Names and labels: docs/metrics.md.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

COUNTERS = {  # snapshot key -> (metric, help)
    "tokens": ("dayzero_tokens_total", "tokens produced (prefill: prompt tokens consumed)"),
    "steps": ("dayzero_steps_total", "batched forward passes"),
    "expert_conversions": ("dayzero_expert_conversions_total", "FP4 experts dequantized"),
    "expert_cache_hits": ("dayzero_expert_cache_hits_total", "dequantized experts found in the cache"),
    "expert_cache_misses": ("dayzero_expert_cache_misses_total", "dequantized experts not in the cache"),
    "encoder_cache_hits": ("dayzero_encoder_cache_hits_total", "images found in the encoder cache"),
    "encoder_cache_misses": ("dayzero_encoder_cache_misses_total", "images run through the vision tower"),
    "handoff_bytes": ("dayzero_handoff_bytes_total", "attention-state bytes moved prefill -> decode"),
    "handoff_seconds": ("dayzero_handoff_seconds_total", "time spent moving attention state"),
    "spec_drafts": ("dayzero_spec_decode_num_drafts_total", "sequence-steps that drafted tokens with the MTP layer"),
    "spec_draft_tokens": ("dayzero_spec_decode_num_draft_tokens_total", "tokens drafted by the MTP layer"),
    "spec_accepted_tokens": ("dayzero_spec_decode_num_accepted_tokens_total", "drafted tokens the model accepted"),
    "grammar_failures": (
        "dayzero_grammar_failures_total",
        "requests whose own schema failed their grammar mid-reply (the client's 400 grammar_failed)",
    ),
}
GAUGES = {
    "batch_size": ("dayzero_batch_size", "sequences in the last batched step (0: nothing to run)"),
    "waiting_requests": ("dayzero_waiting_requests", "claimed requests waiting for blocks (prefill: or a step)"),
    "intake_paused": ("dayzero_intake_paused", "1: no new request taken till the blocks hold one handed back"),
    "admitted_tokens": ("dayzero_admitted_tokens", "decode: tokens of the requests admitted over the last beat"),
    "tokens_per_s": ("dayzero_tokens_per_second", "tokens per second of the last decode step (0: nothing to run)"),
    "selected_fraction": ("dayzero_indexer_selected_fraction", "CSA entries attended / entries available"),
    "expert_cache_hit_rate": ("dayzero_expert_cache_hit_rate", "hits / (hits + misses)"),
    "spec_acceptance_rate": ("dayzero_spec_decode_draft_acceptance_rate", "accepted / drafted tokens since start"),
    "spec_mean_accepted_length": (
        "dayzero_spec_decode_mean_accepted_length",
        "tokens per drafting step (1 + accepted drafts) since start",
    ),
    "encoder_cache_hit_rate": ("dayzero_encoder_cache_hit_rate", "hits / (hits + misses)"),
    "tensor_parallel": ("dayzero_tensor_parallel_ranks", "ranks of the worker's group (the model split over them)"),
    "weights_checked": (
        "dayzero_weights_checked_tensors",
        "quantized tensors whose sample decoded sanely at start (finite power-of-two scales, no all-zero expert)",
    ),
}


class WorkerStats:
    """Thread-safe counters, gauges, per-op call/failure counts and memory by region."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self._lock = threading.Lock()
        self.counters: dict[str, float] = defaultdict(float)
        self.gauges: dict[str, float] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.failures: dict[str, int] = defaultdict(int)
        self.memory: dict[str, int] = {}
        self.pools: dict[str, tuple[int, int]] = {}
        self.serves: dict[str, str | int] = {}  # what another stage must match: KV layout, context

    def add(self, **values: float) -> None:
        with self._lock:
            for key, value in values.items():
                self.counters[key] += value

    def set(self, **values: float) -> None:
        with self._lock:
            self.gauges.update(values)

    def call(self, op: str, failed: bool = False) -> None:
        """One call of ``op`` (``failed``: it raised)."""
        with self._lock:
            self.calls[op] += 1
            if failed:
                self.failures[op] += 1

    def fail(self, op: str) -> None:
        """A request failed in ``op`` whose call is counted already (or that never reached one)."""
        with self._lock:
            self.failures[op] += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "stage": self.stage,
                "counters": dict(self.counters),
                "gauges": dict(self.gauges),
                "calls": dict(self.calls),
                "failures": dict(self.failures),
                "memory": dict(self.memory),
                "pools": {k: list(v) for k, v in self.pools.items()},
                "serves": dict(self.serves),
            }


class SnapshotCollector(Collector):
    """Renders worker snapshots ({worker: snapshot}) as Prometheus metric families (none while
    their source, Redis for the gateway, cannot be read: the scrape still shows the rest)."""

    def __init__(self, source: Callable[[], dict[str, dict]]) -> None:
        self.source = source

    def collect(self) -> Iterator:
        try:
            snapshots = self.source()
        except redis.RedisError:
            snapshots = {}
        labels = ["worker", "stage"]
        families = {
            k: CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
            for k, (name, doc) in COUNTERS.items()
        }
        gauges = {k: GaugeMetricFamily(name, doc, labels=labels) for k, (name, doc) in GAUGES.items()}
        used = GaugeMetricFamily("dayzero_kv_blocks_used", "attention-state blocks in use", labels=[*labels, "pool"])
        capacity = GaugeMetricFamily("dayzero_kv_blocks_capacity", "attention-state blocks", labels=[*labels, "pool"])
        memory = GaugeMetricFamily("dayzero_memory_bytes", "resident bytes by region", labels=[*labels, "region"])
        calls = CounterMetricFamily("dayzero_operator_calls", "operator calls", labels=[*labels, "op"])
        failures = CounterMetricFamily(
            "dayzero_operator_failures", "operator calls that raised", labels=[*labels, "op"]
        )
        queue = SummaryMetricFamily(
            "dayzero_request_queue_time_seconds", "request accepted -> taken by the stage", labels=labels
        )
        for worker, snap in sorted(snapshots.items()):
            base = [worker, snap.get("stage", "")]
            counters = snap.get("counters", {})
            for key, value in counters.items():
                if key in families:
                    families[key].add_metric(base, value)
            if counters.get("queued_requests"):
                queue.add_metric(base, counters["queued_requests"], counters.get("queue_seconds", 0.0))
            for key, value in snap.get("gauges", {}).items():
                if key in gauges:
                    gauges[key].add_metric(base, value)
            for pool, (n_used, n_total) in snap.get("pools", {}).items():
                used.add_metric([*base, pool], n_used)
                capacity.add_metric([*base, pool], n_total)
            for region, value in snap.get("memory", {}).items():
                memory.add_metric([*base, region], value)
            for op, value in snap.get("calls", {}).items():
                calls.add_metric([*base, op], value)
                failures.add_metric([*base, op], snap.get("failures", {}).get(op, 0))
        yield from families.values()
        yield from gauges.values()
        yield _per_position(snapshots)
        yield from (used, capacity, memory, calls, failures, queue)


def _per_position(snapshots: dict[str, dict]) -> CounterMetricFamily:
    """``dayzero_spec_decode_num_accepted_tokens_per_pos_total{position}`` (vLLM's per-position counter)."""
    family = CounterMetricFamily(
        "dayzero_spec_decode_num_accepted_tokens_per_pos",
        "drafted tokens accepted, by draft position (0: the first draft)",
        labels=["worker", "stage", "position"],
    )
    for worker, snap in sorted(snapshots.items()):
        for key, value in snap.get("counters", {}).items():
            if key.startswith("spec_accepted_pos_"):
                family.add_metric([worker, snap.get("stage", ""), key.removeprefix("spec_accepted_pos_")], value)
    return family


class QueueDepthCollector(Collector):
    """``dayzero_queue_depth{stage}``: messages waiting per stage, read at scrape time; and
    ``dayzero_queue_reachable``: 0 when Redis could not be read (the depths are then left out)."""

    def __init__(self, source: Callable[[], dict[str, int]]) -> None:
        self.source = source

    def collect(self) -> Iterator:
        family = GaugeMetricFamily("dayzero_queue_depth", "requests waiting in each stage's queue", labels=["stage"])
        reachable = GaugeMetricFamily("dayzero_queue_reachable", "1: Redis answered this scrape, 0: it did not")
        try:
            depths = self.source()
        except redis.RedisError:
            depths = None
        for stage, depth in (depths or {}).items():
            family.add_metric([stage], depth)
        reachable.add_metric([], float(depths is not None))
        yield from (family, reachable)


def serve_metrics(port: int, source: Callable[[], dict[str, dict]]) -> None:
    """This worker's own /metrics endpoint (scraped directly under compose)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(source))
    start_http_server(port, registry=registry)
