"""The refusals' record (refused_commands.py) as the gateways of one Redis user keep it: met, held,
cleared, read. A real Redis and its ACL; the record's own objects, no gateway around them."""

from __future__ import annotations

import time

import pytest
import redis

from dayzero.procs import scratch_redis
from services.gateway.refused_commands import RefusedCommands
from services.gateway.sent_commands import PassCommands

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
