"""The Lua scripts behind a run's transitions (take, heartbeat, hand off, hand on, hand back),
each fenced: only the request's current run writes. Each runs as one atomic round trip; their keys
come from dayzero.serving.lifecycle, which alone calls them. The queue's own scripts (admission,
re-queue, the reaper's re-run) are in dayzero.serving.queue_scripts, the token stream's (append,
end) in dayzero.serving.stream_scripts."""

from __future__ import annotations

from enum import IntEnum

from .keys import key
from .queue_scripts import PUSH, PUSH_FRONT


class Take(IntEnum):
    """What a stage's attempt to take a delivered request found (``TAKE``'s answer)."""

    STALE = 0  # an older run's delivery, or the request has ended: drop the message
    OWNED = 1  # a live worker holds its lease
    CANCELLED = 2  # claimed, but a client cancelled it: settle it
    CLAIMED = 3  # this worker owns it now; it is no longer queued


# ``mget(from, to)``: the values of KEYS[from..to], read in chunks within Lua's unpack limit (~8000).
# ``current_run``: whether a delivery's run is the request's current one, from its marks at
# marks[at..at + 2] (attempt, done, lease): "over" (an older attempt's, or the request ended),
# "held" (someone else holds the lease, unless it is ``free``: '' for none), or "ours" (the owner
# itself holds it, or nobody: a lease that lapsed unnoticed).
CURRENT_RUN = """
local function mget(from, to)
    local values = {}
    for first = from, to, 4096 do
        for _, value in ipairs(redis.call('MGET', unpack(KEYS, first, math.min(first + 4095, to)))) do
            values[#values + 1] = value
        end
    end
    return values
end
local function current_run(marks, at, run, owner, free)
    if marks[at + 1] or tonumber(run) < tonumber(marks[at] or 0) then
        return 'over'
    end
    local holder = marks[at + 2]
    if holder and holder ~= owner and holder ~= free then
        return 'held'
    end
    return 'ours'
end
"""


# The first lines of a script over KEYS attempt, done, lease and ARGV the run's attempt, its owner:
# 0, nothing written, unless the run is the current one and the lease its owner's or nobody's.
OURS_ONLY = (
    CURRENT_RUN
    + """
if current_run(mget(1, 3), 1, ARGV[1], ARGV[2], '') ~= 'ours' then
    return 0
end
"""
)


def parked_state(parked: bool) -> tuple[str, ...]:
    """The key family TAKE keeps alive with a lease where a state is parked in Redis (decode's claim of
    a state handed off through Redis; HEARTBEAT's: those ``Lifecycle.heartbeat`` is told of); none
    elsewhere: no state is parked there, no key read for it."""
    return ("kvstate",) if parked else ()


# ``outlive(state, ms)``: the request's state parked in Redis (kvstate:{id}, a handoff's across hosts),
# if any (``state`` nil: none can be, no command), lives ``ms`` more, never less than it had: as long as
# its claimer's lease, which a dead claimer's beats no longer renew (the state then lapses with it).
OUTLIVE = """
local function outlive(state, ms)
    if not state then
        return
    end
    local left = redis.call('PTTL', state)
    if left >= 0 and left < tonumber(ms) then
        redis.call('PEXPIRE', state, ms)
    end
end
"""


# KEYS: attempt, done, lease, queued, cancel[, kvstate]; ARGV: the delivery's attempt, owner, lease ms,
# and the lease that counts as free ('': none; decode's: the handoff's). The owner may take again (a
# batch it retries after Redis came back): its lease starts afresh, as a first take's does (the
# heartbeat's next beat may be a third of a lease off), and so does its parked state's life.
TAKE = (
    CURRENT_RUN
    + OUTLIVE
    + """
local run = current_run(mget(1, 3), 1, ARGV[1], ARGV[2], ARGV[4])
if run ~= 'ours' then
    return run == 'held' and 1 or 0
end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
outlive(KEYS[6], ARGV[3])
redis.call('DEL', KEYS[4])
if redis.call('EXISTS', KEYS[5]) == 1 then
    return 2
end
return 3
"""
)


def push_keys(rid: str, mark: str, queue: str) -> list[str]:
    """The KEYS of a fenced push of run ``rid`` onto ``queue`` (HAND_ON, HAND_OFF, HAND_BACK): the
    run's keys, the ``mark`` its message leaves (queued, handoff), the queue and its pushed count."""
    return [*(key(family, rid) for family in ("attempt", "done", "lease", mark)), queue, key("pushed", queue)]


# KEYS: attempt, done, lease, handoff, decode's queue, its pushed count; ARGV: the run's attempt,
# its owner, the handoff's ms, decode's message, the handoff's lease owner. 1: handed off (its
# lease now). 0: nothing written, the run is over: the request ended, or its lease lapsed and it
# was re-run (or taken) elsewhere.
HAND_OFF = (
    PUSH
    + OURS_ONLY
    + """
redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[3])
push(KEYS[5], KEYS[6], KEYS[4], ARGV[4], ARGV[3])
return 1
"""
)


# KEYS: attempt, done, lease, queued, the next stage's queue, its pushed count; ARGV: the run's
# attempt, its owner, the next stage's message, the queued mark's ms, '1' for the queue's front. The
# vision stage's run goes on to prefill (its back), its lease dropped so that prefill may claim it;
# a prefill worker's claimed prompt goes back to the front (room.py). 1: queued there. 0: nothing
# written, the run is over or someone else's (its lease lapsed while it encoded, and a re-run holds it).
HAND_ON = (
    PUSH
    + PUSH_FRONT
    + OURS_ONLY
    + """
redis.call('DEL', KEYS[3])
if ARGV[5] == '1' then
    push_front(KEYS[5], KEYS[6], KEYS[4], ARGV[3], ARGV[4])
else
    push(KEYS[5], KEYS[6], KEYS[4], ARGV[3], ARGV[4])
end
return 1
"""
)


# KEYS: attempt, done, lease, handoff, decode's queue, its pushed count; ARGV: the run's attempt, the
# decode worker that claimed it, decode's message, the handoff's lease owner, the least ms of the
# handoff that must be left. The claimer cannot hold it yet: the handoff waits at the queue's front
# again (the next read takes it), leased to it till its own deadline (prefill keeps its blocks till
# then: prefill_loop.py), with a new mark. 1: handed back. 0: nothing written: the run is over or
# someone else's, or too little of the handoff is left (the claimer keeps it).
HAND_BACK = (
    PUSH_FRONT
    + OURS_ONLY
    + """
local left = redis.call('PTTL', KEYS[4])
if left < tonumber(ARGV[5]) then
    return 0
end
redis.call('SET', KEYS[3], ARGV[4], 'PX', left)
push_front(KEYS[5], KEYS[6], KEYS[4], ARGV[3], left)
return 1
"""
)


# KEYS: a prefill worker's inbox of the handoffs decode took (TAKE_HANDOFFS), then the marks it reads
# of the handoffs it keeps; ARGV: the ids it read from the inbox at its last call and has acted on.
# Those leave the inbox, then its rest is read, with the marks: {inbox, marks}. An id leaves only at the
# call after its read: a reply lost (or a retried call) loses no notice, each read at least once. A
# transaction read and deleted the inbox: with MULTI refused (an ACL) both ran alone, EXEC failed and
# the notices were gone, the blocks kept till the request ended.
RELEASED = (
    CURRENT_RUN
    + """
for _, rid in ipairs(ARGV) do
    redis.call('LREM', KEYS[1], 1, rid)
end
return {redis.call('LRANGE', KEYS[1], 0, -1), #KEYS > 1 and mget(2, #KEYS) or {}}
"""
)

# KEYS per handoff: attempt, done, lease, handoff, cancel, its holder's inbox; ARGV: the owner, lease
# ms, the inboxes' s, the handoff's lease owner, then per handoff: its run's attempt, the request's
# id for the holder's inbox ('': no holder). Decode has imported the states: each current run's
# handoff is decode's now (its lease renewed, its holder told '{id} {attempt}': the run it took).
# The answer, per handoff (``Take``): 0 the run is over or someone else holds the lease (nothing
# written), 2 taken but cancelled, 3 taken.
TAKE_HANDOFFS = (
    CURRENT_RUN
    + """
local taken = {}
for i = 0, #KEYS / 6 - 1 do
    local k, run, rid = 6 * i, ARGV[5 + 2 * i], ARGV[6 + 2 * i]
    if current_run(mget(k + 1, k + 3), 1, run, ARGV[1], ARGV[4]) ~= 'ours' then
        taken[i + 1] = 0
    else
        redis.call('DEL', KEYS[k + 4])
        redis.call('SET', KEYS[k + 3], ARGV[1], 'PX', ARGV[2])
        if rid ~= '' then
            redis.call('RPUSH', KEYS[k + 6], rid .. ' ' .. run)
            redis.call('EXPIRE', KEYS[k + 6], ARGV[3])
        end
        taken[i + 1] = redis.call('EXISTS', KEYS[k + 5]) == 1 and 2 or 3
    end
end
return taken
"""
)


# KEYS per lease: lease, attempt, done, queued, req; then the kvstate of those whose states wait in
# Redis; ARGV: owner, lease ms, the leases, then per lease the run (attempt) the owner holds ('': none
# known), then per kvstate its lease (1-based). Each lease the owner still holds is refreshed, and its
# parked state's life with it (only a state still parked: one its claimer took, as decode reads each
# once it imports it, was read every beat, a missing key, while its request generated). One that lapsed (nobody's:
# Redis was out, or a step ran, past a lease) is taken back while its run is still the request's
# current one: no re-run began (the attempt is the run's; the reaper's re-run bumps it in the script
# that would see this lease), it has not ended, no message of it waits, its record is there. The
# answer lists (1-based) the rest: re-run elsewhere, ended, gone with Redis's data. Keys that are not
# whole leases of 5 with a run each, then states each named by a lease, are refused, nothing written:
# read by a wrong count, one request's keys were another's and leases went unread, none lost.
HEARTBEAT = (
    OUTLIVE
    + """
local lost, held, leases = {}, {}, tonumber(ARGV[3])
local states = leases and #KEYS - 5 * leases
local whole = leases and leases >= 0 and leases % 1 == 0 and states >= 0 and #ARGV == 3 + leases + states
for j = 1, whole and states or 0 do
    local of = tonumber(ARGV[3 + leases + j])
    whole = whole and of and of >= 1 and of <= leases and of % 1 == 0
end
if not whole then
    return redis.error_reply('HEARTBEAT: ' .. #KEYS .. ' keys and ' .. #ARGV - 3 .. ' arguments are not '
        .. tostring(ARGV[3]) .. ' leases of 5 keys and a run each, then states named by their lease')
end
for i = 0, leases - 1 do
    local k, run = 5 * i, ARGV[4 + i]
    local lease = redis.call('GET', KEYS[k + 1])
    if lease == ARGV[1] then
        redis.call('PEXPIRE', KEYS[k + 1], ARGV[2])
        held[i + 1] = true
    elseif not lease and run ~= '' and tonumber(redis.call('GET', KEYS[k + 2]) or 0) == tonumber(run)
        and redis.call('EXISTS', KEYS[k + 3], KEYS[k + 4]) == 0 and redis.call('EXISTS', KEYS[k + 5]) == 1 then
        redis.call('SET', KEYS[k + 1], ARGV[1], 'PX', ARGV[2])
        held[i + 1] = true
    else
        lost[#lost + 1] = i + 1
    end
end
for j = 1, #KEYS - 5 * leases do
    if held[tonumber(ARGV[3 + leases + j])] then outlive(KEYS[5 * leases + j], ARGV[2]) end
end
return lost
"""
)
