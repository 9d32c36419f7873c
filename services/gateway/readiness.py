"""``/ready``: a live worker for every stage, and prefill and decode workers that can hand a
request on. Workers started by hand may disagree with each other or with the gateway: a KV layout
no worker of the other stage shares fails every request it meets (not ready when no pair shares
one), a shorter context cuts requests the gateway admitted (a warning).

A stage's workers are its processes that serve it by their liveness stamps (liveness.py: ready,
stamped within ``FRESH_S``, every second from a thread, a long step too): one killed or frozen is out
within ~3 s. The registry's heartbeats come from the loops between steps and count a worker for 3
leases + 2 s after its last (a step may run that long between two): 11 s after a SIGKILL at the
default lease, with nothing left to serve; they name the processes whose snapshots are compared.
Redis must take writes (each admission is some): /ready writes a key of its own first, and a refusal
is its reason ("redis refuses writes: ..."), not the workers' stamps it stops. A Redis that hangs
(frozen, its host unreachable) is the reason once it has left that write unanswered ``ANSWER_WITHIN_S``:
/ready waited on the gateway's command timeout (10 s), longer than a probe waits (Kubernetes': 1 s),
so a probe saw a hang, not a reason. Past a refusal of seconds the workers' stamps back off (a stamp
period apart: liveness.retry_after): a stage without a live worker wakes them (``wake_stampers``), so
/ready is right again a round trip after Redis's return."""

from __future__ import annotations

import asyncio

import redis
from starlette.concurrency import run_in_threadpool

from dayzero.redis_clients import unreached
from dayzero.redis_refusals import command_refused, refused_for_good
from dayzero.serving.broker import writes_refused
from dayzero.serving.keys import key
from dayzero.serving.liveness import FRESH_S, seen_stages, serving, wake_stampers
from dayzero.serving.messages import SAME_LAYOUT

from .context import Gateway

HANDOFF = ("prefill", "decode")  # the stages a request's KV state passes between
WRITE_PROBE_TTL_MS = 10_000  # /ready's own write (key writable) lapses after
ANSWER_WITHIN_S = 1.0  # /ready's write unanswered this long: its answer is 503, "redis unanswered"


async def readiness(gw: Gateway) -> tuple[dict, int]:
    """``/ready``'s body and status (200 or 503). A command refused the reaper's passes is the reason
    once Redis takes /ready's write: before it, Redis down after such a refusal was still told as the
    refusal, not as unreachable (the passes failing on the outage keep the refusal for after it)."""
    try:
        await asyncio.wait_for(gw.bus.r.set(key("writable"), 1, px=WRITE_PROBE_TTL_MS), ANSWER_WITHIN_S)
        if gw.command_refused is not None:  # (the reaper's passes fail on it; /ready's own commands may not)
            return {"ready": False, "reason": _refused_reason(gw.command_refused, "user a command")}, 503
        return await _readiness(gw)
    except TimeoutError:
        return {"ready": False, "reason": f"redis unanswered for {ANSWER_WITHIN_S:g} s (frozen or unreachable)"}, 503
    except redis.RedisError as exc:
        return {"ready": False, "reason": _redis_reason(gw.settings.redis_url, exc)}, 503


def _redis_reason(url: str, exc: redis.RedisError) -> str:
    """``/ready``'s reason for Redis's error: credentials refused, or its user a command (an ACL: the
    credentials are good), in redis_refusals.refused_for_good's line (it said "unreachable"), writes
    refused, else unreachable."""
    if (refused := refused_for_good(url, exc)) is not None:
        what = "user a command" if command_refused(exc) else "credentials"
        return _refused_reason(refused, what)
    if isinstance(exc, redis.ResponseError) and writes_refused(exc):
        return f"redis refuses writes: {exc}"
    return f"redis unreachable: {unreached(url, exc)}"


def _refused_reason(refused: str, what: str) -> str:
    return f"redis refuses DAYZERO_REDIS_URL's {what}: {refused}"


async def _readiness(gw: Gateway) -> tuple[dict, int]:
    # (after /ready's write: a Redis that answers reads and refuses writes (at its maxmemory, a replica,
    # too few replicas) admits no request; its stamps are writes too: ready for their 3 s, then "no live worker")
    live = await gw.bus.live_workers(("vision",) if gw.image_token is not None else ())
    workers = await run_in_threadpool(lambda: {stage: len(serving(gw.bus.store.r, stage)) for stage in live})
    body: dict = {"ready": True, "workers": workers}
    missing = [stage for stage, count in workers.items() if not count]
    if missing:
        # (Redis took /ready's write: workers whose stamps back off after a long refusal stamp now)
        await run_in_threadpool(wake_stampers, gw.bus.store.r)
        body |= {"ready": False, "reason": f"no live worker for {', '.join(missing)}"}
        loading = await run_in_threadpool(_loading, gw)
        if loading:  # a long start: say how far the workers' weights have come
            body["loading"] = loading
            progress = ", ".join(f"{w} {percent}%" for w, percent in body["loading"].items())
            body["reason"] += f" (loading weights: {progress})"
        return body, 503
    snapshots = await run_in_threadpool(gw.bus.registry.snapshots_of, [p for s in HANDOFF for p in live[s]])
    serves = {stage: {p: snapshots[p].get("serves", {}) for p in live[stage] if p in snapshots} for stage in HANDOFF}
    unshared, warnings = compare(serves, gw.context_limit, gw.settings.speculative_tokens)
    if warnings:
        body["warnings"] = warnings
    if unshared:
        body |= {"ready": False, "reason": unshared}
        return body, 503
    return body, 200


def _loading(gw: Gateway) -> dict[str, int]:
    """The starting workers' progress (percent): of each process its latest start, while that process
    stamps its liveness and is not ready yet. One that died loading left its entry for 2 minutes, and a
    crash loop's ``waiting:`` lines listed each dead start beside the new one (``prefill0@vm:41dcd4 0%,
    prefill0@vm:dada7c 0%``); a restarted container's worker stamps under the same name (its host's,
    pid 1 again), so the process stamping was not enough: its dead start was listed beside it too."""
    found = gw.bus.registry.loading_workers()
    if not found:
        return {}
    stamps = seen_stages(gw.bus.store.r, tuple(sorted({p["stage"] for p in found.values()})))
    latest = {}  # process -> the worker name of its latest start (an entry without one: an earlier version's)
    for worker, p in sorted(found.items(), key=lambda item: item[1].get("started", 0.0)):
        latest[p.get("process", worker)] = worker

    def loading(p: dict) -> bool:
        read = stamps[p["stage"]]
        fresh = read.now - read.alive.get(p.get("process"), float("-inf")) <= FRESH_S
        return "process" not in p or (fresh and p["process"] not in read.ready)

    return {worker: found[worker]["percent"] for worker in latest.values() if loading(found[worker])}


def compare(serves: dict[str, dict[str, dict]], context: int, drafts: int) -> tuple[str, list[str]]:
    """What the workers of the two stages (``{stage: {process: serves}}``) disagree on, with each other
    or with the gateway's context and drafts per step: a reason not to be ready ("" if none) and
    warnings. A worker whose snapshot has not arrived yet is left out."""
    layouts = {stage: {s["layout"] for s in workers.values() if "layout" in s} for stage, workers in serves.items()}
    if all(layouts.values()) and not set.intersection(*layouts.values()):
        shown = "; ".join(f"{stage} {', '.join(sorted(found))}" for stage, found in layouts.items())
        return f"prefill and decode workers share no KV layout ({shown}): {SAME_LAYOUT}", []
    warnings = []
    for stage, other in zip(HANDOFF, reversed(HANDOFF), strict=True):
        for process, s in sorted(serves[stage].items()):
            if layouts[other] and "layout" in s and s["layout"] not in layouts[other]:
                warnings.append(
                    f"{stage} worker {process}: its KV layout matches no {other} worker's, requests passing "
                    f"through it fail: {SAME_LAYOUT}"
                )
            if s.get("context", context) < context:
                warnings.append(
                    f"{stage} worker {process} serves {s['context']} tokens of context, the gateway admits {context}: "
                    "longer requests end early or fail (start every process with the same DAYZERO_MAX_CONTEXT, "
                    "and a DAYZERO_KV_BUDGET_MB whose pools hold it)"
                )
            if stage == "decode" and s.get("drafts", drafts) != drafts:  # (a version before "drafts": unknown)
                warnings.append(
                    f"decode worker {process} drafts {s['drafts']} tokens a step, the gateway's "
                    f"DAYZERO_SPECULATIVE_TOKENS is {drafts}: the system_fingerprint of the replies it decodes "
                    "names the gateway's count, yet a seed draws otherwise (start every process with the same "
                    "DAYZERO_SPECULATIVE_TOKENS)"
                )
    return "", warnings + _refused_block_ids(serves)


def _refused_block_ids(serves: dict[str, dict[str, dict]]) -> list[str]:
    """Decode workers of a version before DAYZERO_HANDOFF_IDS (their snapshots name no ``ids``) beside
    prefill workers that write block ids as bytes (its default): they refuse those handoffs' messages."""
    writers = sorted(process for process, s in serves["prefill"].items() if s.get("ids") == "bytes")
    return [
        f"decode worker {process} is of a version before DAYZERO_HANDOFF_IDS: it refuses the handoffs of prefill "
        f"worker {', '.join(writers)} (block ids as bytes, the default; those requests are re-run): upgrade it, or "
        "set DAYZERO_HANDOFF_IDS=lists on the prefill workers till every decode worker is"
        for process, s in sorted(serves["decode"].items())
        if writers and "layout" in s and "ids" not in s
    ]
