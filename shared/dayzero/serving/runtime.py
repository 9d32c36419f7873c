"""What a worker process holds: the model, the tokenizer, its attention pools, the store."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from ..completion import Completion
from ..config import context_limit
from ..ids_only_codec import IdsOnlyCodec
from ..kv.handoff import warm_up_host_copy
from ..kv.pools import KVPools, OutOfBlocks
from ..kv.shared import Segment
from ..model.plan import AttentionOptions
from ..model.weights import Transformer
from ..parallel.collectives import Group
from ..redis_refusals import REFUSED_FOR_GOOD
from ..settings import Settings
from ..tokenizer import TextCodec, load_codec
from .intake import Ticket
from .lifecycle import Lifecycle
from .metrics import WorkerStats
from .outage_log import OutageLog
from .prefill_batch import BatchInput
from .rank_loading import LoadProgress, load_ranks
from .ranks import Ranks
from .registry import Presence, Registry, process_name

log = logging.getLogger("dayzero.worker")
WARM_UP = "warm-up"  # the scratch sequence of ``Runtime.warm_up``
UNREACHABLE_POLL_S = 1.0  # a starting worker asks an unreachable Redis again this often


def _worker_credentials_checked(client: redis.Redis) -> None:
    """Raises ``AuthenticationError`` where Redis refuses the URL's credentials (``NoPermissionError``
    where it refuses their user PING): the start ends before
    the weights load (they loaded for nothing, and again at each restart under ``dayzero up``: a worker
    whose credentials Redis refuses for DAYZERO_CREDENTIALS_REFUSED_S exits to be started again). A
    Redis down or loading is waited for at the warm-up (``Runtime._load_scripts``), once loaded."""
    try:
        client.ping()
    except REFUSED_FOR_GOOD:  # (a wrong password, a user's ACL without PING)
        raise
    except redis.RedisError:
        pass


@dataclass
class Runtime:
    settings: Settings
    model: Transformer
    codec: TextCodec | IdsOnlyCodec
    pools: KVPools
    store: Lifecycle
    registry: Registry
    name: str
    segment: Segment | None
    stats: WorkerStats
    options: AttentionOptions
    ranks: Ranks  # the model and pools of every rank of the group, in step (one rank: plain calls)
    weight_bytes: int = 0
    _announced: float = 0.0  # monotonic time of the last announce

    def __post_init__(self) -> None:
        self.presence = Presence(self.registry, self.stats.stage, self.name)
        self.unpublished = OutageLog(
            log,
            "metrics not published (Redis: %s); the next beat tries again",
            "%d more beats' metrics not published (Redis) since the last line",
            "metrics published again after %.1f s (%d more beats failed since the last line)",
        )

    @classmethod
    def load(cls, settings: Settings, name: str, stage: str, shared: bool, group: Group | None = None) -> Runtime:
        """``name`` identifies the worker in leases and heartbeats (unique per process); ``shared``:
        pools another process can read (prefill's, unless the handoff goes through Redis);
        ``group``: this worker is rank 0 of a tensor-parallel group (the others ``follow``)."""
        name = process_name(name)
        store = Lifecycle.connect(settings.redis_url, settings.stream_ttl_s)
        _worker_credentials_checked(store.r)
        registry = Registry(store.r)
        progress = LoadProgress(registry, name, stage)
        ranks, segment = load_ranks(settings, group or Group(device=settings.device), shared, progress)
        progress.done()
        model, path = ranks.model, settings.checkpoint_dir()
        log.info("%s weight check: %s", name, model.weight_check.summary())
        log.info("%s loaded %s on %d rank(s): pools %s", name, path, ranks.size, ranks.pools.usage())
        runtime = cls(
            settings,
            model,
            load_codec(path),
            ranks.pools,
            store,
            registry,
            name,
            segment,
            WorkerStats(stage),
            ranks.options,
            ranks,
        )
        runtime.stats.set(weights_checked=model.weight_check.tensors, tensor_parallel=ranks.size)
        runtime.stats.add(grammar_failures=0)  # (scraped from the start: a rate over it needs its zero)
        context = min(context_limit(model.cfg, settings.max_context), ranks.pools.capacity_tokens())  # (budget.py)
        # /ready compares stages ("ids": a worker of a version that reads block ids as bytes, and how it writes them;
        # "drafts": what a seed draws, named by the gateway's system_fingerprint from its own setting)
        runtime.stats.serves = {
            "layout": ranks.pools.layout_hash,
            "context": context,
            "ids": settings.handoff_ids,
            "drafts": settings.speculative_tokens,
        }
        runtime.weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        return runtime

    def completion(self, ticket: Ticket, generated: tuple[int, ...], limit: int) -> Completion:
        """``ticket``'s request's completion, rebuilt from the tokens it has streamed (raises when its
        own sampling cannot be set up: a grammar refused)."""
        request, cfg = ticket.job.request, self.model.cfg
        prompt, thinking = len(request.prompt_ids), request.thinking
        args = (self.codec, request.sampling, cfg.eos_token_ids, prompt, limit, generated, thinking)
        return Completion(*args, compiled=ticket.grammar, prompt_ids=request.prompt_ids)

    def grammar_ready(self, ticket: Ticket) -> bool:
        """Whether ``ticket``'s completion can be built without waiting for its grammar (none, or
        compiled, or refused); the first call starts compiling it, off the serving loop: a loop
        leaves such a request waiting meanwhile, and the others go on. Once compiled, the ticket
        holds it (``grammar``) for its completion's build and every renew after (a row waiting on a
        full lexer renews on it): the cache may drop it meanwhile (more than 256 grammars in use), and
        the build compiled it again, on the loop, the batch frozen. One retired meanwhile (its lexer
        filled by a reply: ``Grammars.retire``) is asked for again: held, it failed the request at the
        first lexer state its reply needed."""
        grammar = ticket.job.request.sampling.grammar
        if grammar is None or not self.codec.has_tokenizer:
            return True
        if ticket.grammar is None or self.codec.grammars.retired(ticket.grammar):
            ticket.grammar = self.codec.grammars.compiled(grammar.lark)
        return ticket.grammar is not None

    def warm_up(self, decode: bool) -> None:
        """Prefill a scratch sequence (``decode``: and decode one step of it) on every rank before
        the worker serves: the first calls compile kernels (numba's on CPU, Triton's on a GPU) and
        fill caches, which would otherwise be the first request's wait (0.25-0.5 s on CPU here). The
        prompt is long enough for every compressor to fold an entry (the indexer's path runs). The
        host pools' handoff copy is compiled where it will run, the lifecycle's Lua scripts loaded
        into Redis; with decode graphs, every batch size's shortest bucket is captured."""
        cfg, start = self.model.cfg, time.monotonic()
        self._load_scripts()
        warm_up_host_copy(self.pools)  # (decode imports every state; prefill copies one to identical prompts)
        length = max(cfg.compress_rates.values(), default=1) + 2
        try:
            self.ranks.reserve(WARM_UP, length + 1)
        except OutOfBlocks as exc:
            log.warning("%s: no warm-up (%s)", self.name, exc)
            return
        try:
            tokens = [1 + i % (cfg.vocab_size - 1) for i in range(length)]
            for chunk in BatchInput(WARM_UP, tokens).chunks(self.settings.prefill_chunk_size, None):
                self.ranks.prefill([chunk])  # the shapes a prompt's steps run
            if decode:
                self.ranks.decode([WARM_UP], [tokens[-1]])
        finally:
            self.ranks.release(WARM_UP)
        if decode and self.ranks.graphs is not None:
            self.ranks.graphs.capture_batches(self.settings.max_batch)
        log.info("%s warmed up in %.2f s", self.name, time.monotonic() - start)

    def _load_scripts(self) -> None:
        """The lifecycle's scripts loaded, waiting while Redis cannot be reached (down, restarting,
        loading its save): one line when it begins waiting, one when it goes on. The worker exited
        there, its weights loaded for nothing, and ``dayzero up`` loaded them again and again (6 starts
        in a 39 s Redis outage of the soak). SIGTERM still ends it (``StageWorker``: while starting).
        A Redis that refuses the URL's credentials ends the start: no wait mends a wrong password (it
        waited forever, a compose healthcheck counting it alive, where it had exited)."""
        waited = None
        while True:
            try:
                self.store.load_scripts()
            except redis.AuthenticationError:  # (a ConnectionError to redis-py)
                raise
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # (loading its save: BusyLoadingError)
                if waited is None:
                    waited = time.monotonic()
                    log.warning("%s waits for Redis (%s); asking every %.0f s", self.name, exc, UNREACHABLE_POLL_S)
                time.sleep(UNREACHABLE_POLL_S)
                continue
            if waited is not None:
                log.warning("%s reached Redis after %.1f s", self.name, time.monotonic() - waited)
            return

    def memory_regions(self, batch: int) -> dict[str, int]:
        """Resident bytes by region (activations and hyper-connection state: estimates for ``batch``)."""
        cfg, model = self.model.cfg, self.model
        converter = getattr(model, "expert_converter", None)
        elem = model.head.weight.element_size()
        # a prefill step packs up to DAYZERO_MAX_PREFILL_TOKENS of its prompts' chunks together
        rows = self.settings.max_prefill_tokens if self.stats.stage == "prefill" else batch
        return {
            "packed_weights": self.weight_bytes,
            "dequant_workspace": converter.counters.workspace_bytes if converter else 0,
            "expert_cache": converter.counters.cache_bytes if converter else 0,
            "attention_pools": self.pools.storage_bytes(),
            "hyper_connection_state": rows * cfg.hc_mult * cfg.hidden_size * 4 * 2,
            "activations": rows * cfg.hidden_size * elem * 8,
        }

    def snapshot(self, batch: int) -> dict:
        """This worker's metrics, published with its heartbeat (see dayzero.serving.metrics)."""
        converter = getattr(self.model, "expert_converter", None)
        if converter is not None:
            c = converter.counters
            self.stats.counters.update(
                expert_conversions=c.conversions, expert_cache_hits=c.cache_hits, expert_cache_misses=c.cache_misses
            )
            if c.cache_hits + c.cache_misses:
                self.stats.set(expert_cache_hit_rate=c.cache_hits / (c.cache_hits + c.cache_misses))
        self.stats.pools = self.pools.usage()
        self.stats.memory = self.memory_regions(batch)
        return self.stats.snapshot()

    def announce(self, batch: int) -> None:
        """This worker is alive, with its metrics: a few times per lease period, not every step.
        Redis refusing the write (at its memory limit, a replica) or lost: the next beat tries again;
        raised, it paused the whole loop, whose prompts under way need no write."""
        now = time.monotonic()
        if now - self._announced >= self.settings.lease_s / 4:
            self._announced = now
            try:
                self.presence.beat(lambda: self.snapshot(batch))
                self.unpublished.back()
            except redis.RedisError as exc:
                self.unpublished.failed(exc)

    def close(self) -> None:
        """Unlink the pool segment, once: SIGTERM's watchdog closes again when Celery's shutdown did."""
        segment, self.segment = self.segment, None
        if segment is not None:
            segment.close()
            segment.unlink()
