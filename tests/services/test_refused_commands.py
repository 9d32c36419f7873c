"""The refusals' record (refused_commands.py) as the gateways of one Redis user keep it: met, held,
cleared, read. A real Redis and its ACL; the record's own objects, no gateway around them."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import pytest
import redis

from dayzero.procs import scratch_redis
from dayzero.serving import redis_clock
from dayzero.serving.keys import key
from services.gateway.reaping import RERUN
from services.gateway.refused_commands import RefusedCommands
from services.gateway.sent_commands import PassCommands, Sent

GRANTS = {"enabled": True, "passwords": ["+pw"], "keys": ["*"], "channels": ["*"]}


def _refusal(client: redis.Redis) -> redis.RedisError:
    """The NOPERM Redis answers ``client`` (an ACL without LRANGE)."""
    with pytest.raises(redis.RedisError) as refused:
        client.lrange("sweep-only", 0, 0)
    return refused.value


def test_a_gateway_with_a_shorter_lease_leaves_a_longer_ones_refusal_its_life(tmp_path):
    """Two gateways of one user, periods of 60 s and 0.2 s, both meeting the refusal: the shorter's
    write set the record's life (and its entry's) to its own 1 s, so 1 s on the longer one read no
    refusal, 4 minutes before its next pass would meet it again. Neither is shortened now."""
    with scratch_redis(tmp_path) as port:
        redis.Redis(port=port).acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        url = f"redis://dz:pw@127.0.0.1:{port}/0"
        long, short = (RefusedCommands(url, redis.Redis.from_url(url), period) for period in (60.0, 0.2))
        for gateway in (long, short):
            assert gateway.tried(_refusal(gateway.r))
            assert "'lrange'" in gateway.settle(PassCommands())
        time.sleep(1.5)  # (past the shorter one's 5 periods)
        assert "'lrange'" in (long.settle(PassCommands()) or ""), long.key
        long.r.close()
        short.r.close()


def test_an_acl_refusing_eval_but_allowing_evalsha_leaves_the_record_shared(tmp_path):
    """LENGTHEN went as EVAL: an ACL that refused EVAL (and allowed EVALSHA, as the gateway's other
    scripts go) refused every write of the record, so a refusal met stayed this gateway's own, the
    other gateways of the user never saw it, and /ready named EVAL. It goes as EVALSHA now."""
    with scratch_redis(tmp_path) as port:
        admin = redis.Redis(port=port)
        admin.acl_setuser("dz", commands=["+@all", "-lrange", "-eval"], **GRANTS)
        url = f"redis://dz:pw@127.0.0.1:{port}/0"
        met, other = (RefusedCommands(url, redis.Redis.from_url(url), 60.0) for _ in range(2))
        assert met.tried(_refusal(met.r))
        assert "'lrange'" in (met.settle(PassCommands()) or ""), met.reason
        admin.script_flush()  # (Redis lost it: NOSCRIPT, loaded and sent again)
        assert met.tried(_refusal(met.r))
        assert "'lrange'" in (met.settle(PassCommands()) or ""), met.reason
        assert "'lrange'" in (other.settle(PassCommands()) or ""), other.reason
        met.r.close()
        other.r.close()


def _url(port: int) -> str:
    return f"redis://dz:pw@127.0.0.1:{port}/0"


def _met_outside_a_step(port: int, refusal: redis.RedisError) -> None:
    """A gateway of a longer lease (its life 2 s) meeting the refusal where no step placed it (None)."""
    stepless = RefusedCommands(_url(port), redis.Redis.from_url(_url(port)), 0.4)
    assert stepless.tried(refusal)
    stepless.settle(PassCommands())
    stepless.r.close()


def _written_without_a_step(port: int, refusal: redis.RedisError) -> None:
    """A gateway from before the steps (its MEET script) writing the entry whole: line and life, 2 s."""
    admin, record = redis.Redis(port=port), key("refused", "dz")
    admin.hset(record, "lrange", json.dumps({"line": str(refusal), "until": redis_clock.now() + 2.0}))
    admin.pexpire(record, 2000)
    admin.close()


def _met_at_the_sweep(port: int) -> RefusedCommands:
    """A gateway (period 0.1 s) that met LRANGE under the sweep (its step: re-run) and recorded it."""
    redis.Redis(port=port).acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
    at_sweep = RefusedCommands(_url(port), redis.Redis.from_url(_url(port)), 0.1)
    assert at_sweep.tried(_refusal(at_sweep.r), Sent("lrange", RERUN))
    assert "'lrange'" in (at_sweep.settle(PassCommands()) or "")
    return at_sweep


def _said_skipping_the_sweep(at_sweep: RefusedCommands) -> list[str]:
    """``at_sweep``'s reasons at passes 0.1 s apart that skip the sweep, for 3 s (past another's 2 s
    write); its client closed after."""
    said, until = [], time.monotonic() + 3.0
    while time.monotonic() < until:
        said.append(at_sweep.settle(PassCommands(skipped={RERUN})) or "")
        time.sleep(0.1)
    at_sweep.r.close()
    return said


@pytest.mark.parametrize("writer", [_met_outside_a_step, _written_without_a_step])
def test_a_later_write_without_a_step_keeps_the_step_the_refusal_was_met_at(
    writer: Callable[[int, redis.RedisError], None], tmp_path
):
    """A gateway met LRANGE under the sweep (its step: re-run), then its passes skip the sweep (another's
    lock) and hold it. Another gateway's later, longer write carrying no step replaced the entry whole:
    the step gone, the holding gateway's next pass held nothing, and the refusal lapsed with the other's
    life (1 s on: /ready healthy, admitting, the ACL unchanged). The entry keeps its step now."""
    with scratch_redis(tmp_path) as port:
        at_sweep = _met_at_the_sweep(port)
        writer(port, _refusal(at_sweep.r))
        said = _said_skipping_the_sweep(at_sweep)
    assert all("'lrange'" in line for line in said), said


def test_a_write_without_a_step_between_the_lengthen_and_the_read_keeps_the_step(tmp_path, monkeypatch):
    """A gateway holding LRANGE's refusal (met under the sweep; its passes skip the sweep) lengthens its
    entry, then reads the record; a gateway from before the steps (MEET) writing the entry whole, longer
    lived, between the two: the read took the entry without its step, the next pass held nothing, and
    the refusal lapsed with the other's life (2 s on: /ready healthy, admitting, the ACL unchanged). The
    holding gateway keeps the step it knew, and its next pass writes it back."""
    with scratch_redis(tmp_path) as port:
        at_sweep = _met_at_the_sweep(port)
        lengthen = at_sweep._lengthened

        def lengthened_then_written_whole(args: list[object]) -> None:
            lengthen(args)
            monkeypatch.setattr(at_sweep, "_lengthened", lengthen)  # (once)
            _written_without_a_step(port, _refusal(at_sweep.r))

        monkeypatch.setattr(at_sweep, "_lengthened", lengthened_then_written_whole)
        said = _said_skipping_the_sweep(at_sweep)
    assert all("'lrange'" in line for line in said), said


def test_a_record_write_sends_no_command_the_read_does_not(tmp_path, caplog):
    """LENGTHEN read the entries' lives with HVALS after its HSETs: an ACL refusing HVALS (an
    allow-list written for the gateway's commands before) failed the write there, the record left
    without a TTL and the script's refusal said beside the command's. It reads them with the read's
    own HGETALL, before its writes."""
    with scratch_redis(tmp_path) as port:
        admin = redis.Redis(port=port)
        admin.acl_setuser("dz", commands=["+@all", "-lrange", "-hvals"], **GRANTS)
        url = f"redis://dz:pw@127.0.0.1:{port}/0"
        met = RefusedCommands(url, redis.Redis.from_url(url), 60.0)
        caplog.set_level(logging.ERROR, "dayzero.redis")
        assert met.tried(_refusal(met.r))
        assert "'lrange'" in (met.settle(PassCommands()) or ""), met.reason
        assert admin.pttl(met.key) > 0
        said = [line.getMessage() for line in caplog.records if "is refused a command" in line.getMessage()]
        assert len(said) == 1 and "'lrange'" in said[0], said
        met.r.close()
        admin.close()
