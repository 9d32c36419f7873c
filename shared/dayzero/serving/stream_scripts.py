"""The Lua scripts that write a request's token stream (dayzero.serving.records): append its
tokens, and end the request with its stream's end, exactly once. Fenced as every transition (only
the current run writes: dayzero.serving.scripts); one atomic round trip each; called by
dayzero.serving.lifecycle alone, with the arguments built here."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from .records import Token, encode
from .scripts import CURRENT_RUN, OURS_ONLY


class Appended(NamedTuple):
    """``APPEND``'s answer."""

    refused: set[str]  # requests whose run is over or someone else's (nothing written for them), or
    # whose stream lacks an earlier token of the run (a lost append: nothing written from the gap on)
    cancelled: set[str]  # of the watched requests, those a client cancelled (none of their tokens written)


class Settled(IntEnum):
    """What ``SETTLE`` did: ended the request (any but STALE), and how its stream ends (its reader
    stops at the first entry with a finish reason: there must be exactly one, the last)."""

    STALE = 0  # the run is over or someone else's: nothing written
    CLOSED = 1  # its stream ends with the entry asked for (or with its last token, as the caller said)
    # the index asked for held a token already (one the caller did not count), or no entry was given and
    # the last token had no finish (an end without a token): the entry went after the stream's last
    MOVED = 2
    CLOSED_BEFORE = 3  # its stream had ended already: no second end added (``done`` records that end's finish)
    UNCLOSED = 4  # its stream could not be closed: the write failed (the gateway ends its readers from ``done``
    # with the end kept beside it: ``unclosed``)


SETTLED_SAYS = {  # how the stream of an ended request closed, when not as asked (logged)
    Settled.MOVED: "went after the stream's last entry (a token held its index, or the last token had no finish)",
    Settled.CLOSED_BEFORE: "was there already (no second end; done records its finish)",
    Settled.UNCLOSED: "could not be written: the gateway ends its readers from the done mark, a keep-alive or two late",
}


def entry_args(t: Token) -> list:
    """A stream entry as ``append_entry`` and ``close_stream`` read it from a script's arguments."""
    fields = [item for pair in encode(t).items() for item in pair]
    return [t.entry_id, "1" if t.finish_reason else "", len(fields), *fields]


# A stream entry id's order (its first part: the entry's index + 1); a stream's last entry, its order
# (0: the stream is empty) and the error of a key that is no stream.
_LAST_ENTRY = """
local function order(id)
    return tonumber(string.match(id, '^%d+'))
end

local function last_entry(stream)
    local last = redis.pcall('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    if last.err then
        return nil, 0, last.err
    end
    return last[1], last[1] and order(last[1][1]) or 0, nil
end
"""


# One entry of a request's token stream (dayzero.serving.records), from ARGV[at]: its entry id, "1"
# when it ends the stream (which then lives ``ttl`` s), its field count (names and values), the
# fields. A replay of an index already streamed is skipped; an index past the stream's next (a gap:
# an earlier append of the run never landed, its round trip timed out) is not written. -> where the
# next entry starts in ARGV, the XADD's error (nil: added, or a replay), and true for a gap.
_APPEND_ENTRY = (
    _LAST_ENTRY
    + """
local function append_entry(stream, at, ttl)
    local fields = tonumber(ARGV[at + 2])
    local _, held, err = last_entry(stream)
    if not err and order(ARGV[at]) > held + 1 then
        return at + 3 + fields, nil, true
    end
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
)


# KEYS: each request's attempt, done and lease, then each one's stream, then the cancel marks to
# read. ARGV: the writer (a lease's owner), a stream's s once it ends, the request count, then per
# request: its run's attempt, where its cancel mark is among those read (1-based; 0: not read), its
# entry count, the entries (``append_entry``). Only the current run writes: a request whose run is
# over or whose lease someone else holds (a stalled worker's, re-run since) gets nothing; nor does
# one whose mark is set (its client left while the tokens were computed: a worker stopped then
# would write them on waking). A run whose entry would leave a gap is refused from there on (its
# worker drops it; the reaper re-runs the request from the stream's end). -> {those refused
# (1-based), the marks}; or the first XADD's error, once every other entry is written.
APPEND = (
    CURRENT_RUN
    + _APPEND_ENTRY
    + """
local n, at, refused, failed = tonumber(ARGV[3]), 4, {}, nil
local marks, cancels = mget(1, 3 * n), mget(4 * n + 1, #KEYS)
for i = 0, n - 1 do
    local run, mark, count = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    at = at + 3
    local ours = current_run(marks, 3 * i + 1, run, ARGV[1], '') == 'ours'
    local writing = ours and not (mark > 0 and cancels[mark])
    if not ours then
        refused[#refused + 1] = i + 1
    end
    for _ = 1, count do
        if writing then
            local err, gap
            at, err, gap = append_entry(KEYS[3 * n + i + 1], at, ARGV[2])
            failed = failed or err
            if gap then  -- (nothing more of this run: refused)
                refused[#refused + 1], writing = i + 1, false
            end
        else
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


# The end of a request's stream, exactly once, from ARGV[at] (``append_entry``'s layout; none: the
# caller says its last token carried the finish reason) -> ``Settled``'s code, and the finish its
# readers were given when the stream had one already. A stream whose last entry has a finish (``f``)
# has ended: nothing is added. An entry whose index a token already holds
# goes after the stream's last entry instead, its index field (``i``) that one's, and so does an end
# without a token (``reason``) when none was given and the last token had no finish: the client's
# reader sees the end in any case (a stream left open was read, with keep-alives, for ever).
_CLOSE_STREAM = (
    _LAST_ENTRY
    + """
local function close_stream(stream, at, ttl, reason)
    local entry, held, err = last_entry(stream)
    if err then
        return 4
    end
    if entry then
        for j = 1, #entry[2], 2 do
            if entry[2][j] == 'f' then
                return #ARGV >= at and 3 or 1, entry[2][j + 1]
            end
        end
    end
    local fields, id, code = {'i', '0', 't', '-1', 'x', '', 'f', reason}, '1-0', 2
    if #ARGV >= at then
        local count = tonumber(ARGV[at + 2])
        fields, id, code = {unpack(ARGV, at + 3, at + 2 + count)}, ARGV[at], 1
    end
    if held >= order(id) then
        id, code = (held + 1) .. '-0', 2
        for j = 1, #fields, 2 do
            if fields[j] == 'i' then
                fields[j + 1] = tostring(held)
            end
        end
    end
    local added = redis.pcall('XADD', stream, id, unpack(fields))
    if type(added) == 'table' and added.err then
        return 4
    end
    redis.call('EXPIRE', stream, ttl)
    return code
end
"""
)


# KEYS: attempt, done, lease, stream, queued, active, req, access, images, kvstate, unclosed, spared; ARGV:
# the run's attempt, the writer, the record's s, the request's id, the reason, then the entry that
# closes the stream (``close_stream``). The request ends: done (the reason; a stream that had ended
# already, the finish its readers were given: a cancel after a finish that landed unanswered is no
# cancel), out of the active set, no lease, no queued mark, no parked state (a handoff no decode
# worker took), its record (and its attempt, its spared count) kept as long as its stream, which expires whether it
# could be closed or not (the caller learns which: ``Settled``); an end its stream could not take is
# kept as unclosed (its fields: the gateway gives it to the stream's readers, its code and usage too).
# 0: nothing written, the run is over or someone else's (a stalled worker's end of a request re-run since).
SETTLE = (
    _CLOSE_STREAM
    + OURS_ONLY
    + """
local closed, finished = close_stream(KEYS[4], 6, ARGV[3], ARGV[5])
redis.call('SET', KEYS[2], finished or ARGV[5], 'EX', ARGV[3])
if closed == 4 and #ARGV >= 6 then  -- (pcall: the end's own write refused, the request still ends)
    redis.pcall('HSET', KEYS[11], unpack(ARGV, 9, 8 + tonumber(ARGV[8])))
    redis.pcall('EXPIRE', KEYS[11], ARGV[3])
end
redis.call('SREM', KEYS[6], ARGV[4])
redis.call('DEL', KEYS[3], KEYS[5], KEYS[10])
for _, i in ipairs({1, 4, 7, 8, 9, 12}) do  -- (the stream too: one left unclosed lived for ever)
    redis.call('EXPIRE', KEYS[i], ARGV[3])
end
return closed
"""
)
