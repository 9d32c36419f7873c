"""The commands Redis refuses the gateways' user (an ACL without them: NOPERM), one record for every
gateway on the Redis that runs as that user: ``refused:{user}`` (keys.py), command (as sent:
sent_commands.py) -> its line and until when it holds (Redis's time). The gateway that meets a refusal records it, for
``HELD_PASSES`` reaper periods, again each time it meets it; one whose pass sees that command
answered (any gateway's of the user) clears it; each reads the record at every pass: /ready's
reason, and admission's 503. Each gateway kept its own, taken back by a pass that ran the step it
was met at: with several gateways, a sweep whose lock another held sent none of its commands yet
counted as run (and a step sends some only for some data: a re-run's only with requests under way),
so the refusal came and went every few passes, /ready flapping. Not counting such a sweep kept a
stale refusal, and its 503s, on a gateway that rarely got the lock. One record for all users had a
gateway whose user the ACL allows the command read another's refusal (503s while the other held
the sweep's lock), and clear it when it swept (the other's /ready healthy meanwhile)."""

from __future__ import annotations

import json
import logging

import redis

from dayzero.redis_clients import without_password
from dayzero.redis_refusals import command_refused, refusal_said, refused_command, refused_for_good
from dayzero.serving import redis_clock as clock
from dayzero.serving.keys import key

log = logging.getLogger("dayzero.redis")
HELD_PASSES = 5  # a record's life, in reaper periods: past a lease of passes that skip its step (2 periods)
# A refusal's entry written, its life (``until``) and the record's lengthened, never shortened: gateways
# of one user with different leases wrote their own, so the shortest lease's 5 periods cut the others'
# (their next pass to meet it was later: /ready healthy between). ARGV: the record's life (ms), then
# command, entry (JSON) pairs.
MEET = """
for i = 2, #ARGV, 2 do
  local found = redis.call('hget', KEYS[1], ARGV[i])
  if not found or cjson.decode(found)['until'] < cjson.decode(ARGV[i + 1])['until'] then
    redis.call('hset', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then redis.call('pexpire', KEYS[1], ARGV[1]) end
"""


class RefusedCommands:
    """This gateway's view of the record: ``reason`` (a refused command's line; None: none refused)."""

    def __init__(self, url: str, client: redis.Redis, period_s: float) -> None:
        self.url, self.r, self.held_s = url, client, HELD_PASSES * period_s
        self.key = key("refused", client.connection_pool.connection_kwargs.get("username") or "default")
        self.reason: str | None = None
        self._met: dict[str, str] = {}  # this pass's refusals: command -> its line
        self._record: dict[str, str] = {}  # the record at the last read: command -> its line

    def tried(self, exc: Exception, sent_as: str | None = None) -> bool:
        """Whether ``exc`` is such a refusal (met this pass: ``settle`` records it), under ``sent_as``: the
        name its command was sent under (sent_commands.py), else the one Redis names."""
        if not command_refused(exc):
            return False
        self._met[sent_as or refused_command(exc)] = refused_for_good(self.url, exc) or str(exc)
        return True

    def settle(self, answered: set[str]) -> str | None:
        """A pass ended, Redis having answered ``answered`` (without an error): its refusals recorded, the
        commands it saw answered cleared, the record read. -> ``reason``."""
        met, self._met = self._met, {}
        try:
            record = self._settled(met, answered - met.keys())
        except redis.RedisError as exc:  # (down, or refusing the record's commands: the last read's, and this
            # pass's, less what it saw answered; a refusal of the record's own said: the last read's was
            # kept for ever, naming a command Redis took again, the refused one never said)
            self.tried(exc)
            kept = {command: line for command, line in self._record.items() if command not in answered}
            record, self._met = {**kept, **met, **self._met}, {}
        self._say(record)
        self._record = record
        self.reason = record[min(record)] if record else None
        return self.reason

    def _settled(self, met: dict[str, str], answered: set[str]) -> dict[str, str]:
        now, refused = clock.now(), self.key
        pipe = self.r.pipeline(transaction=False)  # (no MULTI: a refused one is a refusal to record too)
        if met:
            entries = [
                (command, json.dumps({"line": line, "until": now + self.held_s})) for command, line in met.items()
            ]
            pipe.eval(MEET, 1, refused, int(self.held_s * 1000), *(part for entry in entries for part in entry))
        if answered:
            pipe.hdel(refused, *answered)
        pipe.hgetall(refused)
        found = pipe.execute()[-1]
        entries = {command.decode(): json.loads(entry) for command, entry in found.items()}
        return {command: entry["line"] for command, entry in entries.items() if entry["until"] > now}

    def _say(self, record: dict[str, str]) -> None:
        for command in sorted(record.keys() - self._record.keys()):
            log.error(
                "%s: the gateway serves on, without its reaper's passes (requests of dead workers are not run "
                "again, nor are waits past their bounds ended), till the ACL allows the command",
                refusal_said(self.url, record[command]),
            )
        if self._record and not record:
            log.warning("the Redis at %s takes the gateway's commands again", without_password(self.url))
