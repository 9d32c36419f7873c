"""What the gateway's walk of a schema's grammar found (``schema_problem``), remembered by the
schema's text: a client sends its tools and reply schema again with each request, and 128 forced
tools walked 64 bytes each took ~30 ms of CPU a request (bench/schema_walk.py), seen before or not.
The grammar's compile was cached already (``Grammars``, by its text); its walk was not."""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict

from .dsml import to_json
from .grammar import SCHEMA_PROBE_STEPS, schema_problem

# bytes each forced tool's parameters are walked, all of them sharing ``TOOL_PROBE_BYTES``: 256 each
# for up to 32 tools, down to 64 for 128 (a request may force 128: at 256 bytes each, 30 -> 100-150 ms
# of CPU, 0.4 -> 1.7 s of its admission under load 16; an open object's walk writes keys without end)
TOOL_PROBE_STEPS, TOOL_PROBE_BYTES = 64, 8192


def tool_probe_steps(tools: int) -> int:
    """The bytes each of ``tools`` forced tools' parameters is walked: ``SCHEMA_PROBE_STEPS``, as a
    response_format schema, while they share ``TOOL_PROBE_BYTES`` so (the CPU of 128 walked 64
    bytes each, ~30 ms), fewer down to ``TOOL_PROBE_STEPS`` (one tool walked 64 bytes let its
    parameters failing ~170 bytes in through: every reply failed there)."""
    return max(TOOL_PROBE_STEPS, min(SCHEMA_PROBE_STEPS, TOOL_PROBE_BYTES // max(tools, 1)))


class WalkedSchemas:
    """The problems found walking schemas (None: none), by a digest of each schema's text and the
    bytes walked; the ``most`` latest used kept (a flood of new schemas holds no unbounded memory:
    a digest and a short message each)."""

    def __init__(self, most: int = 4096) -> None:
        self._most = most
        self._found: OrderedDict[tuple[bytes, int], str | None] = OrderedDict()
        self._lock = threading.Lock()  # (the gateway checks requests in its thread pool)

    def problem(self, schema: dict, steps: int = SCHEMA_PROBE_STEPS) -> str | None:
        """``schema_problem(schema, steps)``, walked once per schema text."""
        text = to_json(schema).encode("utf-8", "surrogatepass")  # (a lone surrogate: the walk's to refuse)
        key = (hashlib.blake2b(text, digest_size=16).digest(), steps)
        with self._lock:
            if key in self._found:
                self._found.move_to_end(key)
                return self._found[key]
        problem = schema_problem(schema, steps)
        with self._lock:
            self._found[key] = problem
            if len(self._found) > self._most:
                self._found.popitem(last=False)
        return problem


@functools.cache
def walked_schemas() -> WalkedSchemas:
    """The process's (the gateway's)."""
    return WalkedSchemas()
