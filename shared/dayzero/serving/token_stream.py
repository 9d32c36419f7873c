"""The token stream's side of a request's life (dayzero.serving.lifecycle): the current run's appends,
fenced, and the stream's reads. Its scripts are in dayzero.serving.stream_scripts."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import redis
from opentelemetry import trace
from redis.commands.core import Script

from .keys import key
from .records import Token, decode
from .stream_scripts import Appended, entry_args


class TokenStream:
    """``Lifecycle``'s token-stream transitions, over its client and its registered APPEND script."""

    r: redis.Redis
    ttl_s: int
    _append: Script

    def append(self, tokens: list[Token], runs: Mapping[str, int], owner: str, watch: Sequence[str] = ()) -> Appended:
        """Append tokens for ``owner`` on each request's run (``runs``: id -> attempt) and read the
        cancel marks of ``watch``, in one atomic round trip. Only the current run writes (a worker
        that stalled past its lease while the request was re-run would interleave its tokens with
        the re-run's), and nothing for a watched request a client cancelled: the caller learns both."""
        if not tokens and not watch:
            return Appended(set(), set())
        streams: dict[str, list[Token]] = {}
        for t in tokens:
            streams.setdefault(t.request_id, []).append(t)
        keys = [key(family, rid) for rid in streams for family in ("attempt", "done", "lease")]
        keys += [key("tokens", rid) for rid in streams] + [key("cancel", rid) for rid in watch]
        args, marks_at = [owner, self.ttl_s, len(streams)], {rid: i + 1 for i, rid in enumerate(watch)}
        for rid, entries in streams.items():
            args += [runs[rid], marks_at.get(rid, 0), len(entries)]
            for t in entries:
                args += entry_args(t)
        sent = time.time_ns()  # (a reader may have the entries before this call returns: stamped at their send)
        refused, marks = self._append(keys=keys, args=args)
        trace.get_current_span().add_event("tokens_appended", {"dayzero.tokens": len(tokens)}, timestamp=sent)
        ids, cancelled = list(streams), {rid for rid, mark in zip(watch, marks, strict=True) if mark}
        return Appended({ids[int(i) - 1] for i in refused}, cancelled)

    def streamed_tokens(self, rid: str) -> list[int]:
        return self.stream(rid)[0]

    def stream(self, rid: str) -> tuple[list[int], str | None]:
        """The tokens streamed so far, and the finish reason the stream already ends with (None
        while it is open): one read."""
        entries = [decode(rid, fields) for _, fields in self.r.xrange(key("tokens", rid))]
        return [t.token for t in entries if t.token >= 0], entries[-1].finish_reason if entries else None
