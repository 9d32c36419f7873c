"""Request bookkeeping in Redis: records, leases, cancel marks, token streams, worker heartbeats.

Keys (``dz:`` prefix): ``req:{id}`` the request JSON; ``active`` the set of unfinished ids;
``lease:{id}`` the worker that owns it (expires unless heartbeated); ``cancel:{id}``;
``done:{id}`` its finish reason; ``tokens:{id}`` the token stream (entry id ``{index + 1}-0``,
so Redis itself refuses a duplicate or out-of-order append; fields i index, t token, x text,
f finish reason, u usage, e error, l logprob, k top alternatives, p the prompt's logprobs);
``handoff:{id}`` an unclaimed prefill->decode lease; ``workers:{stage}`` worker heartbeats;
``usage:{worker}`` pool usage; ``loading:{worker}`` a starting worker's loading progress.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import redis

from ..completion import Step
from ..sampling import Logprob
from .messages import GenerationRequest

P = "dz:"


@dataclass(frozen=True, slots=True)
class Token:
    """One stream entry: token ``index`` of a request, the text it released, and on the last one
    the finish reason and usage."""

    request_id: str
    index: int
    token: int
    text: str
    finish: str | None = None
    usage: dict | None = None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    prompt: list[Logprob] | None = None  # on the first token: the prompt's logprobs, when asked for

    @classmethod
    def of(
        cls, request_id: str, index: int, step: Step, usage: dict | None = None, prompt: list[Logprob] | None = None
    ) -> Token:
        return cls(request_id, index, step.token, step.text, step.finish_reason, usage, step.logprob, step.top, prompt)


def stream_key(request_id: str) -> str:
    return f"{P}tokens:{request_id}"


def entry_id(index: int) -> str:
    return f"{index + 1}-0"


class Store:
    def __init__(self, client: redis.Redis, stream_ttl_s: int = 600) -> None:
        self.r = client
        self.stream_ttl_s = stream_ttl_s

    @classmethod
    def connect(cls, url: str, stream_ttl_s: int = 600) -> Store:
        return cls(
            redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=5), stream_ttl_s
        )

    # -- requests -------------------------------------------------------------------------------------
    def register(self, request: GenerationRequest, images: list[bytes] = ()) -> None:
        pipe = self.r.pipeline()
        pipe.set(f"{P}req:{request.request_id}", request.model_dump_json(), ex=self.stream_ttl_s * 4)
        if images:
            pipe.rpush(f"{P}images:{request.request_id}", *images)
            pipe.expire(f"{P}images:{request.request_id}", self.stream_ttl_s * 4)
        pipe.sadd(f"{P}active", request.request_id)
        pipe.execute()

    def images(self, request_id: str) -> list[bytes]:
        return list(self.r.lrange(f"{P}images:{request_id}", 0, -1))

    def request(self, request_id: str) -> GenerationRequest | None:
        raw = self.r.get(f"{P}req:{request_id}")
        return GenerationRequest.model_validate_json(raw) if raw else None

    def active(self) -> list[str]:
        return [m.decode() for m in self.r.smembers(f"{P}active")]

    def finish(self, request_id: str, reason: str) -> None:
        pipe = self.r.pipeline()
        pipe.set(f"{P}done:{request_id}", reason, ex=self.stream_ttl_s)
        pipe.srem(f"{P}active", request_id)
        pipe.delete(f"{P}lease:{request_id}")
        pipe.execute()

    def done(self, request_id: str) -> str | None:
        raw = self.r.get(f"{P}done:{request_id}")
        return raw.decode() if raw else None

    # -- leases and cancellation ------------------------------------------------------------------------
    def claim(self, request_id: str, owner: str, ttl_s: float, force: bool = False) -> bool:
        """Own the request unless someone else alive does (``force``: take it over, e.g. at handoff).
        The owner itself may claim again (a batch it retries after Redis came back)."""
        if self.r.set(f"{P}lease:{request_id}", owner, px=int(ttl_s * 1000), nx=not force):
            return True
        return self.owner(request_id) == owner

    def heartbeat(self, request_ids: list[str], owner: str, ttl_s: float) -> None:
        if request_ids:
            pipe = self.r.pipeline()
            for rid in request_ids:
                pipe.set(f"{P}lease:{rid}", owner, px=int(ttl_s * 1000))
            pipe.execute()

    def release_lease(self, request_id: str) -> None:
        self.r.delete(f"{P}lease:{request_id}")

    def owner(self, request_id: str) -> str | None:
        raw = self.r.get(f"{P}lease:{request_id}")
        return raw.decode() if raw else None

    def attempt(self, request_id: str) -> int:
        raw = self.r.get(f"{P}attempt:{request_id}")
        return int(raw) if raw else 0

    def next_attempt(self, request_id: str) -> int:
        return int(self.r.incr(f"{P}attempt:{request_id}"))

    def mark_queued(self, request_id: str, ttl_s: float) -> None:
        self.r.set(f"{P}queued:{request_id}", 1, px=int(ttl_s * 1000))

    def unqueue(self, request_id: str) -> None:
        self.r.delete(f"{P}queued:{request_id}")

    def queued(self, request_id: str) -> bool:
        return bool(self.r.exists(f"{P}queued:{request_id}"))

    def offer_handoff(self, request_id: str, ttl_s: float) -> None:
        """Prefill's blocks stay leased to the request until decode takes them (or this expires)."""
        pipe = self.r.pipeline()
        pipe.set(f"{P}handoff:{request_id}", 1, px=int(ttl_s * 1000))
        pipe.set(f"{P}lease:{request_id}", "handoff", px=int(ttl_s * 1000))
        pipe.execute()

    def take_handoff(self, request_id: str) -> None:
        self.r.delete(f"{P}handoff:{request_id}")

    def handoffs_open(self, request_ids: list[str]) -> set[str]:
        """Those whose prefill blocks decode may still take: offered, not taken, not expired, not
        cancelled (a request cancelled while it waits for decode frees its blocks at once)."""
        if not request_ids:
            return set()
        pipe = self.r.pipeline()
        for rid in request_ids:
            pipe.exists(f"{P}handoff:{rid}")
            pipe.exists(f"{P}cancel:{rid}")
        replies = pipe.execute()
        return {rid for i, rid in enumerate(request_ids) if replies[2 * i] and not replies[2 * i + 1]}

    def cancel(self, request_id: str) -> None:
        self.r.set(f"{P}cancel:{request_id}", 1, ex=self.stream_ttl_s)

    def cancelled(self, request_ids: list[str]) -> set[str]:
        if not request_ids:
            return set()
        marks = self.r.mget([f"{P}cancel:{rid}" for rid in request_ids])
        return {rid for rid, mark in zip(request_ids, marks, strict=True) if mark}

    # -- token streams --------------------------------------------------------------------------------
    def append(self, tokens: list[Token]) -> list[bool]:
        """Append tokens (one round trip); False where that index was already streamed (a replay)."""
        pipe = self.r.pipeline(transaction=False)
        for t in tokens:
            fields = {"i": t.index, "t": t.token, "x": t.text}
            if t.finish:
                fields["f"] = t.finish
            if t.usage:
                fields["u"] = json.dumps(t.usage)
            if t.logprob is not None:
                fields["l"] = repr(t.logprob)
                fields["k"] = json.dumps(t.top)
            if t.prompt is not None:
                fields["p"] = json.dumps(t.prompt)
            pipe.xadd(stream_key(t.request_id), fields, id=entry_id(t.index))
            if t.finish:
                pipe.expire(stream_key(t.request_id), self.stream_ttl_s)
        replies = iter(pipe.execute(raise_on_error=False))
        added = []
        for t in tokens:
            reply = next(replies)
            if t.finish:
                next(replies)
            if isinstance(reply, redis.ResponseError) and "equal or smaller" not in str(reply):
                raise reply
            added.append(not isinstance(reply, Exception))
        return added

    def end(self, request_id: str, index: int, reason: str, message: str = "") -> None:
        """Close a stream without a token (cancelled, error), at the next index."""
        fields = {"i": index, "t": -1, "x": "", "f": reason, "e": message}
        with contextlib.suppress(redis.ResponseError):  # already closed past this index
            self.r.xadd(stream_key(request_id), fields, id=entry_id(index))
        self.r.expire(stream_key(request_id), self.stream_ttl_s)

    def streamed_tokens(self, request_id: str) -> list[int]:
        return [int(f[b"t"]) for _, f in self.r.xrange(stream_key(request_id)) if int(f[b"t"]) >= 0]

    # -- workers --------------------------------------------------------------------------------------
    def worker_alive(self, stage: str, worker: str, usage: dict | None = None) -> None:
        pipe = self.r.pipeline()
        pipe.hset(f"{P}workers:{stage}", worker, time.time())
        if usage is not None:
            pipe.set(f"{P}usage:{worker}", json.dumps(usage), ex=60)
        pipe.execute()

    def loading(self, worker: str, stage: str, percent: int | None) -> None:
        """A starting worker's weight-loading progress (None: done); lapses if the worker dies."""
        if percent is None:
            self.r.delete(f"{P}loading:{worker}")
        else:
            self.r.set(f"{P}loading:{worker}", json.dumps({"stage": stage, "percent": percent}), ex=120)

    def loading_workers(self) -> dict[str, dict]:
        keys = list(self.r.scan_iter(f"{P}loading:*", count=100))
        values = self.r.mget(keys) if keys else []
        prefix = len(f"{P}loading:")
        return {k.decode()[prefix:]: json.loads(v) for k, v in zip(keys, values, strict=True) if v}

    def live_workers(self, stage: str, within_s: float) -> list[str]:
        now = time.time()
        beats = self.r.hgetall(f"{P}workers:{stage}")
        return [w.decode() for w, t in beats.items() if now - float(t) <= within_s]

    def queue_depths(self, stages: tuple[str, ...]) -> dict[str, int]:
        """Messages waiting in each stage's Celery queue (a Redis list named after the queue)."""
        pipe = self.r.pipeline()
        for stage in stages:
            pipe.llen(stage)
        return dict(zip(stages, pipe.execute(), strict=True))

    def snapshots(self) -> dict[str, dict]:
        """Every live worker's latest metrics snapshot."""
        keys = list(self.r.scan_iter(f"{P}usage:*"))
        values = self.r.mget(keys) if keys else []
        return {k.decode().split(":", 2)[2]: json.loads(v) for k, v in zip(keys, values, strict=True) if v}
