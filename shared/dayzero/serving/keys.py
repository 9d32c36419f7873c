"""The names of dayzero's keys in Redis. What a request's keys hold, state by state: lifecycle.py's
table. The others, no request's:

workers:{stage}, usage:{worker}, loading:{worker} (registry.py), alive:{stage}, ready:{stage},
stamp_now (liveness.py), unserved:{stage}, restart:{stage}, counted:{stage} (no_worker_count.py),
up:{process} `dayzero up`'s check that Redis takes writes (stack.py), writable /ready's
(gateway/readiness.py), tensor:{key} parked image embeddings (parked.py), wake:{gateway} the stream
reader's wake-up, reaper (its lock: reaper.py), gateways the gateways that run on the Redis (gateways.py),
refused:{user} the commands Redis refuses the gateways' user (gateway/refused_commands.py).
"""

from __future__ import annotations

P = "dz:"
HANDOFF_OWNER = "handoff"
QUEUES = ("vision", "prefill", "decode")  # the stages whose messages are counted (a mark says which)


def key(family: str, name: str = "") -> str:
    """``dz:{family}:{name}`` (``dz:{family}`` for the global ones: active, reaper)."""
    return f"{P}{family}:{name}" if name else f"{P}{family}"
