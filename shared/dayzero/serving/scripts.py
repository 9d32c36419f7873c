"""The Lua scripts behind a run's transitions (take, heartbeat, hand off, append to the token
stream, end), each fenced: only the request's current run writes. Each runs as one atomic round
trip; their keys come from dayzero.serving.lifecycle, which alone calls them. The queue's own
scripts (admission, re-queue, the reaper's re-run) are in dayzero.serving.queue_scripts."""

from __future__ import annotations

from enum import IntEnum

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
_CURRENT_RUN = """
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
_OURS_ONLY = (
    _CURRENT_RUN
    + """
if current_run(mget(1, 3), 1, ARGV[1], ARGV[2], '') ~= 'ours' then
    return 0
end
"""
)


# One entry of a request's token stream (dayzero.serving.records), from ARGV[at]: its entry id, "1"
# when it ends the stream (which then lives ``ttl`` s), its field count (names and values), the
# fields. A replay of an index already streamed is skipped. -> where the next entry starts in ARGV,
# and the XADD's error (nil: added, or a replay).
_APPEND_ENTRY = """
local function append_entry(stream, at, ttl)
    local fields = tonumber(ARGV[at + 2])
    local added = redis.pcall('XADD', stream, ARGV[at], unpack(ARGV, at + 3, at + 2 + fields))
    if type(added) == 'table' and added.err then
        if not string.find(added.err, 'equal or smaller', 1, true) then
            return at + 3 + fields, added.err
        end
    elseif ARGV[at + 1] == '1' then
        redis.call('EXPIRE', stream, ttl)
    end
    return at + 3 + fields, nil
end
"""


# KEYS: attempt, done, lease, queued, cancel; ARGV: the delivery's attempt, owner, lease ms, and
# the lease that counts as free ('': none; decode's: the handoff's). The owner may take again (a
# batch it retries after Redis came back): its lease starts afresh, as a first take's does (the
# heartbeat's next beat may be a third of a lease off).
TAKE = (
    _CURRENT_RUN
    + """
local run = current_run(mget(1, 3), 1, ARGV[1], ARGV[2], ARGV[4])
if run ~= 'ours' then
    return run == 'held' and 1 or 0
end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[4])
if redis.call('EXISTS', KEYS[5]) == 1 then
    return 2
end
return 3
"""
)


# KEYS: attempt, done, lease, handoff, decode's queue, its pushed count; ARGV: the run's attempt,
# its owner, the handoff's ms, decode's message, the handoff's lease owner. 1: handed off (its
# lease now). 0: nothing written, the run is over: the request ended, or its lease lapsed and it
# was re-run (or taken) elsewhere.
HAND_OFF = (
    PUSH
    + _OURS_ONLY
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
    + _OURS_ONLY
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
    + _OURS_ONLY
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


# KEYS per handoff: attempt, done, lease, handoff, cancel, its holder's inbox; ARGV: the owner, lease
# ms, the inboxes' s, the handoff's lease owner, then per handoff: its run's attempt, the request's
# id for the holder's inbox ('': no holder). Decode has imported the states: each current run's
# handoff is decode's now (its lease renewed, its holder told). The answer, per handoff (``Take``):
# 0 the run is over or someone else holds the lease (nothing written), 2 taken but cancelled, 3 taken.
TAKE_HANDOFFS = (
    _CURRENT_RUN
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
            redis.call('RPUSH', KEYS[k + 6], rid)
            redis.call('EXPIRE', KEYS[k + 6], ARGV[3])
        end
        taken[i + 1] = redis.call('EXISTS', KEYS[k + 5]) == 1 and 2 or 3
    end
end
return taken
"""
)


# KEYS: leases; ARGV: owner, lease ms. Each lease the owner still holds is refreshed; the answer
# lists (1-based) those it does not: lapsed, taken over after a lapse, or gone with Redis's data.
HEARTBEAT = """
local lost = {}
for i, lease in ipairs(KEYS) do
    if redis.call('GET', lease) == ARGV[1] then
        redis.call('PEXPIRE', lease, ARGV[2])
    else
        lost[#lost + 1] = i
    end
end
return lost
"""


# KEYS: each request's attempt, done and lease, then each one's stream, then the cancel marks to
# read. ARGV: the writer (a lease's owner), a stream's s once it ends, the request count, then per
# request: its run's attempt, where its cancel mark is among those read (1-based; 0: not read), its
# entry count, the entries (``append_entry``). Only the current run writes: a request whose run is
# over or whose lease someone else holds (a stalled worker's, re-run since) gets nothing; nor does
# one whose mark is set (its client left while the tokens were computed: a worker stopped then
# would write them on waking). -> {those refused (1-based), the marks}; or the first XADD's error,
# once every other entry is written.
APPEND = (
    _CURRENT_RUN
    + _APPEND_ENTRY
    + """
local n, at, refused, failed = tonumber(ARGV[3]), 4, {}, nil
local marks, cancels = mget(1, 3 * n), mget(4 * n + 1, #KEYS)
for i = 0, n - 1 do
    local run, mark, count = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    at = at + 3
    local ours = current_run(marks, 3 * i + 1, run, ARGV[1], '') == 'ours'
    if ours and not (mark > 0 and cancels[mark]) then
        for _ = 1, count do
            local err
            at, err = append_entry(KEYS[3 * n + i + 1], at, ARGV[2])
            failed = failed or err
        end
    else
        if not ours then
            refused[#refused + 1] = i + 1
        end
        for _ = 1, count do
            at = at + 3 + tonumber(ARGV[at + 2])
        end
    end
end
if failed then
    return redis.error_reply(failed)
end
return {refused, cancels}
"""
)


# KEYS: attempt, done, lease, stream, queued, active, req, access, images; ARGV: the run's
# attempt, the writer, the record's s, the request's id, the reason, then the entry that closes
# the stream (``append_entry``; none: its last token carried the finish; one that fails ends it
# all the same). The request ends: done, out of the active set, no lease, no queued mark, its
# record (and its attempt) kept as long as its stream. 0: nothing written, the run is over or
# someone else's (a stalled worker's end of a request re-run since).
SETTLE = (
    _APPEND_ENTRY
    + _OURS_ONLY
    + """
if #ARGV > 5 then
    append_entry(KEYS[4], 6, ARGV[3])
end
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[3])
redis.call('SREM', KEYS[6], ARGV[4])
redis.call('DEL', KEYS[3], KEYS[5])
for _, i in ipairs({1, 7, 8, 9}) do
    redis.call('EXPIRE', KEYS[i], ARGV[3])
end
return 1
"""
)
