"""The no-worker count: for how long a stage has had no serving process (``unserved_for``), read by
the gateway's reaper from the liveness stamps (liveness.py: their keys and what serving means), and
begun again after an outage that aged the stamps (``count_again``)."""

from __future__ import annotations

import redis

from .client_scripts import registered
from .keys import key
from .liveness import FRESH_S, kept_old, seen_stages

PROVEN_S = 10.0  # a process ready this long ends its stage's no-worker count (unserved_for)

# The no-worker counts' marks after a read of the stamps, in one step (one round trip a pass where reads and
# writes apart were up to five a stage). KEYS: each stage's unserved, restart, counted; ARGV: Redis's time at
# the read, then for each stage whether it is served ("proven": by a process ready PROVEN_S, "young", or
# "none"), how many readiness times follow, and its processes' readiness times. -> for each stage, where
# its count runs from (nil: no count). A proven process ends the count; none begins it (kept if begun).
# The count runs from the readiness of the first process ready after it began, once one is (``restart``):
# such a process loaded, the time before it was a start (a long first load, a worker's restart), not a
# crash loop, and its death soon after (killed, or out of memory on a request) is one as any worker's: its
# restart gets the whole bound (one killed 5 s after the stack's first readiness had the 8 requests waiting
# at its stage ended at once, the first load counted, where its restart served them ~30 s later). Once per
# count: kept where the process's entries go (forgotten, or overwritten by a restart under the same id:
# then the time it served is counted); the next one dead as young is a crash loop past its load, its load
# and restart counted. A restart mark older than the count is of an earlier one (left by a gateway that
# deleted only its mark): not. Every gateway finds the same. Each call marks when it counted (``count_again``).
COUNT = """
local function count(unserved, restart_key, counted, now, serves, readiness)
    redis.call('SET', counted, now)
    if serves == 'proven' then
        redis.call('DEL', unserved, restart_key)
        return false
    end
    if serves == 'none' then redis.call('SET', unserved, now, 'NX') end
    local since = redis.call('GET', unserved)
    if not since then return false end
    local restart = redis.call('GET', restart_key)
    if restart and tonumber(restart) >= tonumber(since) then return restart end
    local first
    for _, ready in ipairs(readiness) do
        if tonumber(ready) >= tonumber(since) and (not first or tonumber(ready) < tonumber(first)) then
            first = ready
        end
    end
    if not first then return since end
    redis.call('SET', restart_key, first)
    return first
end
local found, at = {}, 2
for i = 1, #KEYS, 3 do
    local n = tonumber(ARGV[at + 1])
    local readiness = {}
    for j = 1, n do readiness[j] = ARGV[at + 1 + j] end
    found[#found + 1] = count(KEYS[i], KEYS[i + 1], KEYS[i + 2], ARGV[1], ARGV[at], readiness)
    at = at + 2 + n
end
return found
"""


def unserved_for(client: redis.Redis, stage: str) -> float:
    """How long ``stage`` has had no serving process (``unserved_stages``)."""
    return unserved_stages(client, (stage,))[stage]


def unserved_stages(client: redis.Redis, stages: tuple[str, ...]) -> dict[str, float]:
    """How long each of ``stages`` has had no serving process (0: it has one now), counted from the
    first call that found none (not from its last stamp: after Redis itself was down or frozen every
    stamp is old, until the workers stamp again within a second); two round trips, whatever the
    stages (a read of their stamps, ``COUNT``). A process ready for less than ``PROVEN_S`` pauses
    the count (it serves: nothing waiting there ends) but does not end it: the time it served (from
    its readiness to its last stamp) is left out of the count, the rest goes on. So one that served
    a while and froze leaves its stage the time since its last stamp, and the time before it was
    ready, not the time it served (a decode that served 9 s and froze had its requests ended ~3 s
    later); and one that dies soon after each start (a crash loop past its load: on its first
    request, or its first minutes of work) leaves its loads and restarts counted, as a loading one
    does: what waits there still ends. Except for the first process ready since the count began
    (``COUNT``): the time before it was a start that loaded (a long first load, a restart), not a
    crash loop."""
    found = seen_stages(client, stages)
    fresh, keys, args = {}, [], [repr(next(iter(found.values())).now)]
    for stage, (now, alive, ready) in found.items():
        fresh[stage] = [since for p, since in ready.items() if now - alive[p] <= FRESH_S]
        proven = any(now - since >= PROVEN_S for since in fresh[stage])
        keys += [key("unserved", stage), key("restart", stage), key("counted", stage)]
        args += ["proven" if proven else "young" if fresh[stage] else "none", len(ready), *map(repr, ready.values())]
    counts = {}
    for stage, raw in zip(stages, registered(client, COUNT)(keys=keys, args=args), strict=True):
        now, alive, ready = found[stage]
        if raw is None and (old := kept_old(found[stage])):  # no count runs: the time they served counts no more
            for family in ("alive", "ready"):
                client.hdel(key(family, stage), *old)
        if raw is None or fresh[stage]:
            counts[stage] = 0.0
            continue
        since = float(raw)
        covered = _covered([(max(since, ready_at), min(alive[p], now)) for p, ready_at in ready.items()])
        counts[stage] = now - since - covered
    return counts


# KEYS: each stage's unserved, restart, counted, alive, ready; ARGV: since when the caller failed (Redis's
# time), FRESH_S. Kept: a stage counted since by anyone, or that no ready process served at its last count or since.
COUNT_AGAIN = """
for i = 1, #KEYS, 5 do
    local counted = redis.call('GET', KEYS[i + 2])
    if not counted or tonumber(counted) < tonumber(ARGV[1]) then
        local served = not counted
        local ready = redis.call('HKEYS', KEYS[i + 4])
        for j = 1, #ready do
            local stamp = redis.call('HGET', KEYS[i + 3], ready[j])
            if stamp and tonumber(stamp) >= tonumber(counted or 0) - tonumber(ARGV[2]) then served = true end
        end
        if served then redis.call('DEL', KEYS[i], KEYS[i + 1]) end
    end
end
"""


def count_again(client: redis.Redis, stages: tuple[str, ...], failed_at: float) -> None:
    """Begin ``stages``' no-worker counts again (``unserved_for``) after Redis was lost, frozen or
    refused writes since ``failed_at`` (Redis's time): the stamps aged through the outage, and a count
    running then (a worker ready under ``PROVEN_S``) took it all for time unserved at Redis's return
    (a 26 s refusal ended requests ``no_worker`` at a 5 s bound). Not a stage that no ready process
    served at its last count or since (a stamp within ``FRESH_S`` of it): it keeps its count, the
    outage in it (what waited there waited one bound more). Nor one some gateway counted since
    ``failed_at`` (Redis answered it: one gateway's flapping network reset everyone's counts)."""
    families = ("unserved", "restart", "counted", "alive", "ready")
    keys = [key(family, stage) for stage in stages for family in families]
    registered(client, COUNT_AGAIN)(keys=keys, args=[repr(failed_at), repr(FRESH_S)])


def _covered(spans: list[tuple[float, float]]) -> float:
    """The time the (start, end) ``spans`` cover together (overlaps once; an empty one nothing)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, reached)
        if end > start:
            total, reached = total + end - start, end
    return total
