"""The prefill stage's loop: pack waiting prompts, run prefill, stream the first token, hand off.

Each prompt is ``prompt + tokens already streamed`` (non-empty only when a request is
re-run after a worker failure). The first sampled token is appended to the request's
stream at once (time to first token); unless it ends the request, the attention state is
published for decode and its blocks stay leased until decode takes them or the lease expires.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

import redis
import torch
from opentelemetry import trace

from ..completion import Completion, context_limit
from ..kv.handoff import export_state, import_state
from ..kv.pools import OutOfBlocks
from ..model.forward import prefill
from ..model.vocab import embed_tokens
from ..sampling import Logprob, PromptLogprobs
from ..telemetry import continued, tracer
from ..vision.encoder import splice
from .handoff import discard_tensor, publish, take_tensor
from .intake import Intake, Ticket, run_loop
from .lease import Heartbeat
from .messages import DecodeJob, PrefillJob
from .runtime import Runtime
from .store import Token

log = logging.getLogger("dayzero.prefill")


class PrefillLoop:
    def __init__(self, runtime: Runtime, send_decode: Callable[[DecodeJob], None]) -> None:
        self.r, self.send_decode = runtime, send_decode
        self.intake: Intake[PrefillJob] = Intake()
        self.pending: list[Ticket[PrefillJob]] = []
        self.handed_off: set[str] = set()
        self.stop = threading.Event()

    def run_forever(self) -> None:
        run_loop(self.stop, self._iteration, log)

    def _iteration(self) -> None:
        self.pending.extend(self.intake.drain(0.05 if not self.pending else 0))
        self._reclaim_handoffs()
        self.r.store.worker_alive("prefill", self.r.name, self.r.snapshot(len(self.pending) or 1))
        if self.pending:
            taken = self._take_batch()
            try:
                self._run([t for t in taken if self._admit(t)])
            except redis.RedisError:
                self._put_back(self._unsettled(taken))
                raise
            except Exception as exc:  # a failed forward ends its requests, never the loop
                self._fail(self._unsettled(taken), exc)

    def _fail(self, batch: list[Ticket[PrefillJob]], exc: Exception) -> None:
        log.exception("prefill of %d request(s) failed", len(batch))
        self.r.stats.call("prefill", failed=True)
        for ticket in batch:
            self.r.pools.release(ticket.job.request.request_id)
            self._settle(ticket, "error", f"prefill failed: {type(exc).__name__}")

    def _unsettled(self, taken: list[Ticket[PrefillJob]]) -> list[Ticket[PrefillJob]]:
        """The tickets of a batch neither handed on, nor ended, nor waiting for blocks."""
        return [t for t in taken if not t.done.is_set() and t not in self.pending]

    def _put_back(self, unsettled: list[Ticket[PrefillJob]]) -> None:
        """Redis failed mid-batch: free these requests' blocks and retry them later."""
        for ticket in unsettled:
            self.r.pools.release(ticket.job.request.request_id)
        self.pending[:0] = unsettled

    def _settle(self, ticket: Ticket[PrefillJob], reason: str, message: str = "", index: int | None = None) -> None:
        """End a request without handing it to decode (freeing its parked image embeddings); its
        stream closes at ``index`` (default: after the tokens it came with)."""
        job, store = ticket.job, self.r.store
        rid = job.request.request_id
        if job.embeddings is not None:
            discard_tensor(job.embeddings, store)
        store.end(rid, len(job.generated) if index is None else index, reason, message)
        store.finish(rid, reason)
        ticket.done.set()

    def _take_batch(self) -> list[Ticket[PrefillJob]]:
        batch, tokens = [], 0
        while self.pending:
            job = self.pending[0].job
            size = len(job.request.prompt_ids) + len(job.generated)
            if batch and tokens + size > self.r.settings.max_prefill_tokens:
                break
            batch.append(self.pending.pop(0))
            tokens += size
        return batch

    def _reclaim_handoffs(self) -> None:
        """Release blocks whose handoff decode has taken (or that expired)."""
        if self.handed_off:
            still = self.r.store.handoffs_open(sorted(self.handed_off))
            for rid in self.handed_off - still:
                self.r.pools.release(rid)
            self.handed_off = still

    def _admit(self, ticket: Ticket[PrefillJob]) -> bool:
        """Claim the request and its blocks; False when the ticket is settled without prefill."""
        store, job = self.r.store, ticket.job
        rid = job.request.request_id
        if (
            rid in self.r.pools.sequences  # a duplicate delivery of a request this worker holds
            or job.attempt < store.attempt(rid)
            or store.done(rid)
            or not store.claim(rid, self.r.name, self.r.settings.lease_s)
        ):
            ticket.done.set()  # stale redelivery, finished, or owned by a live worker
            return False
        store.unqueue(rid)
        if store.cancelled([rid]):
            self._settle(ticket, "cancelled")
            return False
        try:
            self.r.pools.reserve(rid, len(job.request.prompt_ids) + len(job.generated))
        except OutOfBlocks as exc:
            if exc.permanent:
                self._settle(ticket, "error", str(exc))
            else:
                store.mark_queued(rid, self.r.settings.visibility_timeout_s)  # wait for blocks
                self.pending.append(ticket)
            return False
        return True

    def _run(self, batch: list[Ticket[PrefillJob]]) -> None:
        """Prefill admitted requests together; emit each one's first token and hand it to decode."""
        if not batch:
            return
        ids = [t.job.request.request_id for t in batch]
        prompts = [list(t.job.request.prompt_ids) + list(t.job.generated) for t in batch]
        embeds = [self._embeddings(t.job) for t in batch]
        settings, model = self.r.settings, self.r.model
        spans = [self._span(t.job, len(batch)) for t in batch]
        now = time.time()
        self.r.stats.add(
            steps=1,
            queued_requests=len(batch),
            queue_seconds=sum(now - t.job.request.created for t in batch),
        )
        self.r.stats.set(batch_size=len(batch))
        self.r.stats.call("prefill")
        echo = {  # prompt logprobs, once: a re-run's first token was streamed already
            i: PromptLogprobs(t.job.request.prompt_logprobs)
            for i, t in enumerate(batch)
            if t.job.request.prompt_logprobs is not None and not t.job.generated
        }
        limit = context_limit(model.cfg, settings.max_context)
        # the leases live until each request is handed on: a slow emit of a large batch must not let
        # the last ones lapse (the reaper would re-run a request that is being handed to decode)
        with Heartbeat(self.r.store, ids, self.r.name, settings.lease_s) as beat:
            logits = self._forward(ids, prompts, embeds, echo)
            for i, ticket in enumerate(batch):
                beat.release(ids[i])
                with trace.use_span(spans[i], end_on_exit=True):
                    try:
                        self._emit(ticket, logits[i], limit, echo[i].scores if i in echo else None)
                    except redis.RedisError:
                        raise
                    except Exception as exc:  # this request's own sampling or handoff: it fails alone
                        self._fail_one(ticket, exc)

    def _fail_one(self, ticket: Ticket[PrefillJob], exc: Exception) -> None:
        rid = ticket.job.request.request_id
        log.exception("request %s failed after its prefill", rid)
        self.r.stats.call("prefill", failed=True)
        self.handed_off.discard(rid)
        self.r.pools.release(rid)
        streamed = len(self.r.store.streamed_tokens(rid))  # its first token may have gone out already
        self._settle(ticket, "error", f"failed after prefill: {type(exc).__name__}", streamed)

    def _forward(
        self,
        ids: list[str],
        prompts: list[list[int]],
        embeds: list[torch.Tensor | None],
        echo: dict[int, PromptLogprobs],
    ) -> list[torch.Tensor]:
        """Each request's next-token logits. Identical text prompts (the choices of an ``n`` > 1
        request) run once; the others copy that state into their own blocks."""
        first: dict[tuple, int] = {}
        copy_of = {}
        for i, prompt in enumerate(prompts):
            if embeds[i] is None:
                copy_of[i] = first.setdefault((tuple(prompt), echo[i].top if i in echo else None), i)
        run = [i for i in range(len(ids)) if copy_of.get(i, i) == i]
        settings, pools = self.r.settings, self.r.pools
        computed = prefill(
            self.r.model,
            pools,
            [ids[i] for i in run],
            [prompts[i] for i in run],
            settings.attention(),
            settings.prefill_chunk_size,
            [embeds[i] for i in run] if any(e is not None for e in embeds) else None,
            {j: echo[i] for j, i in enumerate(run) if i in echo},
        )
        logits = dict(zip(run, computed, strict=True))
        for i, source in copy_of.items():
            if source != i:
                import_state(pools, pools, export_state(pools, ids[source]), ids[i])
                logits[i] = logits[source]
                if i in echo:
                    echo[i].scores = echo[source].scores
        self.r.stats.add(tokens=sum(len(prompts[i]) for i in run))
        return [logits[i] for i in range(len(ids))]

    @staticmethod
    def _span(job: PrefillJob, batch: int) -> trace.Span:
        with continued(job.trace):
            return tracer.start_span(
                "prefill.forward",
                attributes={
                    "dayzero.request_id": job.request.request_id,
                    "dayzero.batch_size": batch,
                    "dayzero.prompt_tokens": len(job.request.prompt_ids) + len(job.generated),
                    "dayzero.images": job.request.images,
                    "dayzero.attempt": job.attempt,
                },
            )

    def _embeddings(self, job: PrefillJob) -> torch.Tensor | None:
        """Input embeddings with the images' rows spliced in (None for a text-only prompt)."""
        if job.embeddings is None:
            return None
        prompt, image_token = list(job.request.prompt_ids), self.r.model.cfg.raw["image_token_id"]
        model = self.r.model
        embed = partial(embed_tokens, model)  # vocabulary rows split over a tensor-parallel group
        device = model.embed.weight.device
        images = take_tensor(job.embeddings, self.r.store).to(device)
        with torch.inference_mode():
            rows = splice(embed(torch.tensor(prompt, device=device)), prompt, image_token, [images])
            tail = embed(torch.tensor(list(job.generated), dtype=torch.long, device=device))  # a re-run: text after
        return torch.cat((rows, tail))

    def _emit(self, ticket: Ticket[PrefillJob], logits, limit: int, prompt_logprobs: list[Logprob] | None) -> None:
        job, store, settings = ticket.job, self.r.store, self.r.settings
        rid, prompt = job.request.request_id, job.request.prompt_ids
        completion = Completion(
            self.r.codec,
            job.request.sampling.params(),
            self.r.model.cfg.eos_token_ids,
            len(prompt),
            limit,
            job.generated,
        )
        step = completion.next(logits)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": completion.count}
        first = Token.of(rid, completion.count - 1, step, usage if step.finish_reason else None, prompt_logprobs)
        store.append([first])
        if step.finish_reason:
            self.r.pools.release(rid)
            store.finish(rid, step.finish_reason)
        else:
            with tracer.start_as_current_span("kv.export", attributes={"dayzero.transport": settings.handoff}):
                start = time.perf_counter()
                ref = publish(self.r.pools, rid, rid, settings.handoff, store, settings.handoff_timeout_s)
                self.r.stats.add(handoff_seconds=time.perf_counter() - start)
            store.offer_handoff(rid, settings.handoff_timeout_s)
            if settings.handoff == "redis":
                self.r.pools.release(rid)
            else:
                self.handed_off.add(rid)
            self.send_decode(
                DecodeJob(
                    request=job.request,
                    generated=(*job.generated, step.token),
                    state=ref,
                    attempt=job.attempt,
                    trace=job.trace,
                )
            )
        ticket.done.set()
