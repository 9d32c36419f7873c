"""How ``dayzero up`` shares a GPU between the workers it places on it.

Unset DAYZERO_KV_BUDGET_MB, a CUDA worker's weights and attention state take DAYZERO_KV_MEMORY_FRACTION
of its device's memory (serving/budget.py). ``up`` runs every worker on the same devices: each one
on DAYZERO_DEVICE (``cuda``: cuda:0), a group's rank r on cuda:r. Each prefill and decode worker gets
the fraction split over the workers on its most crowded device (0.8 / 2 for one GPU's prefill and
decode), in its own environment; a fraction the user set is each worker's own, refused where the
workers on one device would take more than MOST_KV_MEMORY_FRACTION of it (one worker's own bound).
(Vision workers hold no attention state: their tower comes out of what the fraction leaves.)"""

from __future__ import annotations

import math
from collections import Counter

from .settings import MOST_KV_MEMORY_FRACTION, Settings

KV_WORKERS = ("prefill", "decode")  # the services that size pools from the fraction


def devices_of(device: str, ranks: int) -> list[int]:
    """The CUDA devices a worker of ``ranks`` ranks computes on (parallel/group.py's rule)."""
    return list(range(ranks)) if ranks > 1 else [int(device.partition(":")[2] or 0)]


def kv_fractions(settings: Settings, counts: dict[str, int], ranks: dict[str, int]) -> dict[str, dict[str, str]]:
    """service -> the environment its workers get from ``up``: DAYZERO_KV_MEMORY_FRACTION, split where
    workers share a device. ``counts``: workers per service; ``ranks``: ranks per worker (default 1).
    ValueError where a fraction the user set, taken by each worker on one device, is more than it."""
    if not settings.device.startswith("cuda") or settings.kv_budget_mb is not None:
        return {}  # (no fraction is read)
    placed = {service: devices_of(settings.device, ranks.get(service, 1)) for service in KV_WORKERS}
    workers = Counter(d for service in KV_WORKERS for d in placed[service] for _ in range(counts.get(service, 0)))
    crowd = {service: max(workers[d] for d in placed[service]) for service in KV_WORKERS}
    fraction = settings.kv_memory_fraction
    if "kv_memory_fraction" in settings.model_fields_set:
        device, most = workers.most_common(1)[0]
        if fraction * most > MOST_KV_MEMORY_FRACTION + 1e-9:  # (19 x 0.05 is 0.9500000000000001 in floats)
            at_most = math.floor(100 * MOST_KV_MEMORY_FRACTION / most) / 100  # (rounded down: 0.17 x 6 was refused)
            raise ValueError(
                f"DAYZERO_KV_MEMORY_FRACTION={fraction} is each worker's share of its GPU, and up places {most} "
                f"prefill and decode workers on cuda:{device}: set it to {at_most:.2f} or less (unset, up splits "
                "its default between them)"
            )
        return {}
    split = {s: fraction / crowd[s] for s in KV_WORKERS if counts.get(s, 0) and crowd[s] > 1}
    return {s: {"DAYZERO_KV_MEMORY_FRACTION": repr(share)} for s, share in split.items()}
