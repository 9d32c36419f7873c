"""The commands Redis refuses the gateways' user (an ACL without them: NOPERM), one record for every
gateway on the Redis that runs as that user: ``refused:{user}`` (keys.py), command (as sent:
sent_commands.py) -> its line, the step of a pass it was met at, and until when it holds (Redis's
time). The gateway that meets a refusal records it, for ``HELD_PASSES`` reaper periods, again each
time it meets it; one whose pass sees that command answered (any gateway's of the user) clears it;
one whose pass skipped the step it was met at holds it (lengthens it as a meeting does); each reads
the record at every pass: /ready's reason, and admission's 503. Each gateway kept its own, taken
back by a pass that ran the step it was met at: with several gateways, a sweep whose lock another
held sent none of its commands yet counted as run (and a step sends some only for some data: a
re-run's only with requests under way), so the refusal came and went every few passes, /ready
flapping. One record for all users had a gateway whose user the ACL allows the command read
another's refusal (503s while the other held the sweep's lock), and clear it when it swept. One
record a user, lapsing 5 periods after its last meeting, still flapped on a gateway that rarely won
the sweep's lock from another user's: held now, a refusal lifted meanwhile is said till a gateway of
the user sweeps again (its answer clears it)."""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass

import redis

from dayzero.redis_refusals import command_refused, refusal_said, refused_command, refused_for_good
from dayzero.redis_urls import without_password
from dayzero.serving import redis_clock as clock
from dayzero.serving.keys import key

from .sent_commands import PassCommands, Sent

log = logging.getLogger("dayzero.redis")
HELD_PASSES = 5  # a refusal's life, in reaper periods, at passes that run its step and send it no more
# A refusal's entry written (met) or merged where it is (met or held: its life and line, the longer
# lived's; its step, the new one's, else the one it had), its life (``until``) and the record's never
# shortened: gateways of one user with different leases wrote their own, so the shortest lease's 5
# periods cut the others' (their next pass to meet it was later: /ready healthy between). A later life
# written whole dropped the step another had met it at (a meeting no step placed: None; a gateway from
# before steps): the passes that skip that step no longer held it, and it lapsed with that life, the
# ACL unchanged. The record lives as long as its longest-lived entry: read from the entries, not from its
# TTL (a PTTL the ACL refused failed the write: the refusal went unshared, and said twice, the script's
# too), with HGETALL before the writes (the record's read sends it anyway: HVALS after the HSETs was one
# more command an ACL could refuse, failing the write the same way). ARGV: Redis's time now (s), then
# command, entry (JSON), 'met' or 'held' triples.
LENGTHEN = """
local record, last = redis.call('hgetall', KEYS[1]), tonumber(ARGV[1])
for i = 2, #record, 2 do last = math.max(last, cjson.decode(record[i])['until']) end
for i = 2, #ARGV, 3 do
  local found, entry = redis.call('hget', KEYS[1], ARGV[i]), cjson.decode(ARGV[i + 1])
  if found then
    local was = cjson.decode(found)
    if entry['step'] == cjson.null then entry['step'] = was['step'] end
    if was['until'] > entry['until'] then entry['line'], entry['until'] = was['line'], was['until'] end
    redis.call('hset', KEYS[1], ARGV[i], cjson.encode(entry))
  elseif ARGV[i + 2] == 'met' then
    redis.call('hset', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  if found or ARGV[i + 2] == 'met' then last = math.max(last, entry['until']) end
end
if last > tonumber(ARGV[1]) then redis.call('pexpire', KEYS[1], math.ceil((last - tonumber(ARGV[1])) * 1000)) end
"""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A command's refusal: its line, and the step of a pass it was met at (sent_commands.Sent)."""

    line: str
    step: str | None


def _entry(refusal: Refusal, until: float) -> str:
    return json.dumps({"line": refusal.line, "step": refusal.step, "until": until})


class RefusedCommands:
    """This gateway's view of the record: ``reason`` (a refused command's line; None: none refused)."""

    def __init__(self, url: str, client: redis.Redis, period_s: float) -> None:
        self.url, self.r, self.held_s = url, client, HELD_PASSES * period_s
        self.key = key("refused", client.connection_pool.connection_kwargs.get("username") or "default")
        self._lengthen = client.register_script(LENGTHEN)
        self.reason: str | None = None
        self._met: dict[str, Refusal] = {}  # this pass's refusals, by command
        self._record: dict[str, Refusal] = {}  # the record at the last read, by command

    def tried(self, exc: Exception, sent: Sent | None = None) -> bool:
        """Whether ``exc`` is such a refusal (met this pass: ``settle`` records it), under the name its
        command was ``sent`` under (sent_commands.py), else the one Redis names."""
        if not command_refused(exc):
            return False
        line = refused_for_good(self.url, exc) or str(exc)
        self._met[sent.name if sent else refused_command(exc)] = Refusal(line, sent.step if sent else None)
        return True

    def held_at(self, this_pass: PassCommands) -> set[str | None]:
        """The steps ``this_pass`` skipped that a refusal of the last read was met at (``settle`` holds it)."""
        return {refusal.step for refusal in self._held(this_pass).values()}

    def _held(self, this_pass: PassCommands) -> dict[str, Refusal]:
        """The last read's refusals met at a step ``this_pass`` skipped, neither met nor seen answered in it."""
        told = self._met.keys() | this_pass.answered
        return {
            c: refusal for c, refusal in self._record.items() if refusal.step in this_pass.skipped and c not in told
        }

    def settle(self, this_pass: PassCommands) -> str | None:
        """A pass ended: its refusals recorded, the commands it saw answered cleared, those met at a step
        it skipped held (a sweep whose lock another gateway held told nothing of one: it lapsed there, and
        a gateway that rarely won the lock said it every few passes, /ready flapping), the record read.
        -> ``reason``."""
        held = self._held(this_pass)
        met, self._met = self._met, {}
        answered = this_pass.answered - met.keys()
        try:
            record = self._settled(met, held, answered)
        except redis.RedisError as exc:  # (down, or refusing the record's commands: the last read's, and this
            # pass's, less what it saw answered; a refusal of the record's own said: the last read's was
            # kept for ever, naming a command Redis took again, the refused one never said)
            self.tried(exc)
            kept = {command: refusal for command, refusal in self._record.items() if command not in answered}
            record, self._met = {**kept, **met, **self._met}, {}
        self._say(record)
        self._record = record
        self.reason = record[min(record)].line if record else None
        return self.reason

    def _settled(self, met: dict[str, Refusal], held: dict[str, Refusal], answered: set[str]) -> dict[str, Refusal]:
        now, refused = clock.now(), self.key
        until = now + self.held_s
        written = [(command, _entry(refusal, until), "met") for command, refusal in met.items()]
        written += [(command, _entry(refusal, until), "held") for command, refusal in held.items()]
        if written:
            self._lengthened([repr(now), *itertools.chain.from_iterable(written)])
        pipe = self.r.pipeline(transaction=False)  # (no MULTI: a refused one is a refusal to record too)
        if answered:
            pipe.hdel(refused, *answered)
        pipe.hgetall(refused)
        found = pipe.execute()[-1]
        entries = {command.decode(): json.loads(entry) for command, entry in found.items()}
        # (an entry read without a step keeps the one this gateway knew: a gateway from before the steps
        # (MEET) wrote it whole between LENGTHEN and this read, and the next pass held nothing: lapsed)
        known = {c: refusal.step for was in (self._record, held, met) for c, refusal in was.items() if refusal.step}
        return {
            c: Refusal(entry["line"], entry.get("step") or known.get(c))
            for c, entry in entries.items()
            if entry["until"] > now
        }

    def _lengthened(self, args: list[object]) -> None:
        """LENGTHEN with ``args``: EVALSHA (NOSCRIPT: loaded, sent again, as redis-py does), else EVAL where
        the ACL refuses one of those (Redis keeps an EVAL's script: the next EVALSHA finds it). As EVAL
        alone, an ACL refusing EVAL (the gateway's other scripts go as EVALSHA) refused every write of the
        record: each gateway kept the refusals it met, the others of its user never saw them."""
        try:
            self._lengthen([self.key], args)
        except redis.ResponseError as exc:
            if not command_refused(exc):
                raise
            self.r.eval(LENGTHEN, 1, self.key, *args)

    def _say(self, record: dict[str, Refusal]) -> None:
        for command in sorted(record.keys() - self._record.keys()):
            log.error(
                "%s: the gateway serves on, without its reaper's passes (requests of dead workers are not run "
                "again, nor are waits past their bounds ended), till the ACL allows the command",
                refusal_said(self.url, record[command].line),
            )
        if self._record and not record:
            log.warning("the Redis at %s takes the gateway's commands again", without_password(self.url))
