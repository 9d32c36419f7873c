"""The Lua scripts behind the lifecycle's transitions that read before they write: each runs as one
atomic round trip. Their keys come from dayzero.serving.lifecycle, which alone calls them."""

from __future__ import annotations

from enum import IntEnum

# A message pushed onto a stage's queue (a Redis list: LPUSH here, the workers' BRPOP takes the
# oldest) is counted in ``pushed``, and the request's mark (queued, or the handoff's) names the
# queue and the count: "prefill:41". Once ``pushed`` - LLEN reaches 41 the message has left the
# list, so such a mark with nobody's lease beside it is a message a worker took and never claimed
# (it died in between): the reaper re-runs it at once instead of after the mark's lapse. A mark
# without a count ("1": recorded only, or a re-run on its way) keeps the reaper away until it lapses.
_PUSH = """
local function push(queue, pushed, mark, message, ms)
    redis.call('SET', mark, queue .. ':' .. redis.call('INCR', pushed), 'PX', ms)
    redis.call('LPUSH', queue, message)
end
"""


# KEYS: the stage's queue, its pushed count, active, then per request: req, access, queued, images.
# ARGV: bound, keep s, queued ms, reader, image count k, the k images, then per request: id, record,
# broker message ('': record only). 0: refused (the queue would pass ``bound``), nothing written.
ADMIT = (
    _PUSH
    + """
local n, k = (#KEYS - 3) / 4, tonumber(ARGV[5])
if redis.call('LLEN', KEYS[1]) + n > tonumber(ARGV[1]) then
    return 0
end
for i = 0, n - 1 do
    local rid, at = ARGV[6 + k + 3 * i], 3 + 4 * i
    redis.call('SET', KEYS[at + 1], ARGV[7 + k + 3 * i], 'EX', ARGV[2])
    if k > 0 then
        redis.call('RPUSH', KEYS[at + 4], unpack(ARGV, 6, 5 + k))
        redis.call('EXPIRE', KEYS[at + 4], ARGV[2])
    end
    redis.call('SET', KEYS[at + 2], ARGV[4], 'EX', ARGV[2])
    redis.call('SADD', KEYS[3], rid)
    local message = ARGV[8 + k + 3 * i]
    if message ~= '' then
        push(KEYS[1], KEYS[2], KEYS[at + 3], message, ARGV[3])
    else
        redis.call('SET', KEYS[at + 3], 1, 'PX', ARGV[3])
    end
end
return 1
"""
)


# KEYS: the stage's queue, its pushed count, queued, lease; ARGV: the message, queued ms. Queued
# again (vision -> prefill, a re-run): its lease dropped, so that the stage's worker may claim it.
ENQUEUE = (
    _PUSH
    + """
redis.call('DEL', KEYS[4])
push(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
"""
)


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
    _PUSH
    + _OURS_ONLY
    + """
redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[3])
push(KEYS[5], KEYS[6], KEYS[4], ARGV[4], ARGV[3])
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


# KEYS: done, req, queued, lease, attempt, active, handoff, orphan, then each stage's queue and
# its pushed count; ARGV: queued ms, the request's id, the handoff's lease owner, a sighting's ms.
# The reaper's check and re-run in one step, so no transition can come between them: an unfinished
# request that nobody holds (the handoff's lease counts only while decode's message waits) and
# whose message no longer waits in its queue is queued again (-> its new attempt; its message is
# the caller's to push); one that ended or whose record expired leaves the active set (-> 0); any
# other is left alone (-> 0). The attempt lives as long as the request's record. A message that
# left its queue unclaimed is re-run only when a sweep finds it so a second time with the same
# mark (the ``orphan`` sighting): a live worker's claim may be just behind its pop, and the first
# sweep's re-run would prefill the request twice.
RERUN = """
local function waits(mark)
    local queue, count = string.match(mark, '^(.+):(%d+)$')
    for i = 9, #KEYS, 2 do
        if KEYS[i] == queue then
            return tonumber(count) > tonumber(redis.call('GET', KEYS[i + 1]) or 0) - redis.call('LLEN', KEYS[i])
        end
    end
    return true
end
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SREM', KEYS[6], ARGV[2])
    return 0
end
local lease, handoff, left = redis.call('GET', KEYS[4]), redis.call('GET', KEYS[7]), false
if lease then
    if not (lease == ARGV[3] and handoff and not waits(handoff)) then
        return 0
    end
    left = handoff
end
local mark = redis.call('GET', KEYS[3])
if mark then
    if waits(mark) then
        return 0
    end
    left = mark
end
if left and redis.call('GET', KEYS[8]) ~= left then
    redis.call('SET', KEYS[8], left, 'PX', ARGV[4])
    return 0
end
redis.call('DEL', KEYS[4], KEYS[7], KEYS[8])
redis.call('SET', KEYS[3], 1, 'PX', ARGV[1])
local attempt, record_ms = redis.call('INCR', KEYS[5]), redis.call('PTTL', KEYS[2])
if record_ms > 0 then
    redis.call('PEXPIRE', KEYS[5], record_ms)
end
return attempt
"""


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
# request: its run's attempt, its entry count, the entries (``append_entry``). Only the current run
# writes: a request whose run is over or whose lease someone else holds (a stalled worker's,
# re-run since) gets nothing. -> {those refused (1-based), the marks}; or the first XADD's error,
# once every other entry is written.
APPEND = (
    _CURRENT_RUN
    + _APPEND_ENTRY
    + """
local n, at, refused, failed = tonumber(ARGV[3]), 4, {}, nil
local marks = mget(1, 3 * n)
for i = 0, n - 1 do
    local run, count = ARGV[at], tonumber(ARGV[at + 1])
    at = at + 2
    if current_run(marks, 3 * i + 1, run, ARGV[1], '') == 'ours' then
        for _ = 1, count do
            local err
            at, err = append_entry(KEYS[3 * n + i + 1], at, ARGV[2])
            failed = failed or err
        end
    else
        refused[#refused + 1] = i + 1
        for _ = 1, count do
            at = at + 3 + tonumber(ARGV[at + 2])
        end
    end
end
if failed then
    return redis.error_reply(failed)
end
return {refused, mget(4 * n + 1, #KEYS)}
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
