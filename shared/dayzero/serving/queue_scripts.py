"""The Lua scripts that put a request's message on a stage's queue (a Redis list) and the reaper's
re-run of one that nobody holds: each runs as one atomic round trip. Their keys come from
dayzero.serving.lifecycle, which alone calls them."""

from __future__ import annotations

# A message pushed onto a stage's queue (a Redis list: LPUSH here, the workers' BRPOP takes the
# oldest) is counted in ``pushed``, and the request's mark (queued, or the handoff's) names the
# queue and the count: "prefill:41". Once ``pushed`` - LLEN reaches 41 the message has left the
# list, so such a mark with nobody's lease beside it is a message a worker took and never claimed
# (it died in between): the reaper re-runs it at once instead of after the mark's lapse. A mark
# without a count ("1": recorded only, or a re-run on its way) keeps the reaper away until it lapses.
PUSH = """
local function push(queue, pushed, mark, message, ms)
    redis.call('SET', mark, queue .. ':' .. redis.call('INCR', pushed), 'PX', ms)
    redis.call('LPUSH', queue, message)
end
"""


# A claimed message handed back (scripts.py: HAND_ON's and HAND_BACK's ``push_front``) goes where the
# next read takes it, the list's right end (as kombu restores a message; its priority is always 0,
# so the list is the stage's own key): pushed to the back, it waited behind every message admitted
# after it. ``pushed`` stays: each message behind it leaves one read later, and ``pushed`` - LLEN,
# one lower from here on, says so; its own mark is ``pushed`` - LLEN before it, reached once it left.
PUSH_FRONT = """
local function push_front(queue, pushed, mark, message, ms)
    local count = tonumber(redis.call('GET', pushed) or 0) - redis.call('LLEN', queue)
    redis.call('SET', mark, queue .. ':' .. math.max(count, 0), 'PX', ms)
    redis.call('RPUSH', queue, message)
end
"""


# KEYS: the stage's queue, its pushed count, active, then per request: req, access, queued, images,
# watchers. ARGV: bound, keep s, queued ms, reader, image count k, the k images, then per request:
# id, record, broker message ('': record only), its first reader ('': none yet). 0: refused (the
# queue would pass ``bound``), nothing written. An admission that ran already (a client retried it
# when the reply was lost) writes nothing more.
ADMIT = (
    PUSH
    + """
if redis.call('EXISTS', KEYS[4]) == 1 then
    return 1
end
local n, k = (#KEYS - 3) / 5, tonumber(ARGV[5])
if redis.call('LLEN', KEYS[1]) + n > tonumber(ARGV[1]) then
    return 0
end
for i = 0, n - 1 do
    local rid, at, first = ARGV[6 + k + 4 * i], 3 + 5 * i, 7 + k + 4 * i
    redis.call('SET', KEYS[at + 1], ARGV[first], 'EX', ARGV[2])
    if k > 0 then
        redis.call('RPUSH', KEYS[at + 4], unpack(ARGV, 6, 5 + k))
        redis.call('EXPIRE', KEYS[at + 4], ARGV[2])
    end
    redis.call('SET', KEYS[at + 2], ARGV[4], 'EX', ARGV[2])
    redis.call('SADD', KEYS[3], rid)
    local message, watcher = ARGV[first + 1], ARGV[first + 2]
    if watcher ~= '' then
        redis.call('SADD', KEYS[at + 5], watcher)
        redis.call('EXPIRE', KEYS[at + 5], ARGV[2])
    end
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
    PUSH
    + """
redis.call('DEL', KEYS[4])
push(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
"""
)


# ``next_run``: the request's next run (RERUN's, RERUN_HELD's): its attempt counted, living as its record,
# its lease, handoff, orphan sighting and parked state dropped, queued for ``queued_ms`` (its message on the way).
NEXT_RUN = """
local function next_run(req, queued, lease, attempt, handoff, orphan, kvstate, queued_ms)
    local record_ms, run = redis.call('PTTL', req), tonumber(redis.call('GET', attempt) or 0) + 1
    redis.call('DEL', lease, handoff, orphan, kvstate)
    redis.call('SET', queued, 1, 'PX', queued_ms)
    if record_ms > 0 then
        redis.call('SET', attempt, run, 'PX', record_ms)
    else
        redis.call('SET', attempt, run, 'KEEPTTL')
    end
    return run
end
"""


# KEYS: done, req, queued, lease, attempt, active, handoff, orphan, kvstate, then each stage's queue
# and its pushed count; ARGV: queued ms, the request's id, the handoff's lease owner, a sighting's ms.
# The reaper's check and re-run in one step, so no transition can come between them: an unfinished
# request that nobody holds (the handoff's lease counts only while decode's message waits) and
# whose message no longer waits in its queue is queued again (-> its new attempt; its message is
# the caller's to push); one that ended or whose record expired leaves the active set (-> 0); any
# other is left alone (-> 0). The attempt lives as long as the request's record, whose TTL is read before
# the re-run's writes: read after, a refusal of it (ACL -pttl) left the lease dropped and an attempt counted,
# nothing sent, one more at each sweep (the request ended 'failed on several workers', never run again). Its
# writes are DEL then SETs (the attempt's with its life: INCR then PEXPIRE, a refused PEXPIRE (ACL -pexpire)
# counted the attempt and failed the same way): a refusal of either writes no attempt. A message that
# left its queue unclaimed is re-run only when a sweep finds it so a second time with the same
# mark (the ``orphan`` sighting): a live worker's claim may be just behind its pop, and the first
# sweep's re-run would prefill the request twice. The run re-run is over: its state parked in Redis
# (a handoff's, claimed by a decode worker that died, or lost with its message) goes with it, read by
# nobody (it stayed till its TTL, the handoff's timeout, or till the new run's prefill parked anew).
RERUN = (
    NEXT_RUN
    + """
local function waits(mark)
    local queue, count = string.match(mark, '^(.+):(%d+)$')
    for i = 10, #KEYS, 2 do
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
return next_run(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7], KEYS[8], KEYS[9], ARGV[1])
"""
)


# KEYS: done, req, queued, lease, attempt, handoff, orphan, kvstate, spared; ARGV: queued ms, the run's
# attempt, its owner, "1" if spared. A live worker that stops gives up the run it holds: the re-run RERUN
# makes of a lapsed lease (-> its new attempt; its message is the caller's to push), made at once, fenced:
# only while the request is unfinished, its record there, the run the current one and its lease the
# owner's (-> 0, nothing written). The stopping worker's writes after it are stale (the attempt), its
# beats too. A spared run (its worker's loop ended: no failure) is counted in spared, as attempt lives.
RERUN_HELD = (
    NEXT_RUN
    + """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 0 then
    return 0
end
if redis.call('GET', KEYS[4]) ~= ARGV[3] or tonumber(redis.call('GET', KEYS[5]) or 0) ~= tonumber(ARGV[2]) then
    return 0
end
if ARGV[4] == '1' then
    local record_ms, spared = redis.call('PTTL', KEYS[2]), tonumber(redis.call('GET', KEYS[9]) or 0) + 1
    if record_ms > 0 then
        redis.call('SET', KEYS[9], spared, 'PX', record_ms)
    else
        redis.call('SET', KEYS[9], spared, 'KEEPTTL')
    end
end
return next_run(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], ARGV[1])
"""
)
