"""The vision stage: a request's images -> merged-patch embeddings, parked for prefill.

The image bytes wait in Redis (the gateway put them there); the embeddings go to a shared
memory segment (or a Redis key across hosts), never through the broker. An image the
encoder refuses ends the request with an error entry in its stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict

import torch

from ..settings import Settings
from ..shm import unlink_parked_before
from ..telemetry import continued
from ..vision.encoder import VisionEncoder, load_tower
from ..vision.images import ImageError
from . import redis_clock as clock
from .intake import Ticket
from .lease import Heartbeat
from .lifecycle import Lifecycle
from .messages import PrefillJob
from .metrics import WorkerStats
from .outage_log import OutageLog
from .parked import discard_tensor, publish_tensor, sweep_parked
from .registry import Presence, Registry, process_name

log = logging.getLogger("dayzero.vision")


class VisionStage:
    grouped = False  # one process (worker.Stage)

    def __init__(self, settings: Settings, name: str, prefill_message: Callable[[PrefillJob], str]) -> None:
        tower = load_tower(settings.checkpoint_dir())
        if tower is None:
            raise RuntimeError("the checkpoint has no vision tower (no vision_config in config.json)")
        tower.to(settings.device)
        self.settings, self.name, self.prefill_message = settings, process_name(name), prefill_message
        self.encoder = VisionEncoder(
            tower, settings.patch_spec(asdict(tower.cfg)), settings.image_limits(), settings.encoder_cache_mb << 20
        )
        self.encoder.warm_up()  # before the stage announces itself
        self.store = Lifecycle.connect(settings.redis_url, settings.stream_ttl_s)
        self.presence = Presence(Registry(self.store.r), "vision", self.name)
        self.stats = WorkerStats("vision")
        self._lock = threading.Lock()
        self.stop = threading.Event()  # (its presence's beats, its claims; a SIGTERM sets it as the encodes go on)
        self._closed = threading.Event()  # the leases' beats end with the process: ``close``
        # (an encode past the group timeout is hung: the leases lapse)
        lease_s, hung_s = settings.lease_s, settings.group_timeout_s
        self.heartbeat = Heartbeat(self.store, self.name, lease_s, self.stop, hung_s, beats_until=self._closed)

    def run_forever(self) -> None:
        """Heartbeats (the work itself arrives through ``handle``) and the sweep of parked embeddings."""
        beats_failed = OutageLog(
            log,
            "heartbeat failed (%s)",
            "%d more heartbeats failed since the last line",
            "heartbeats go through again after %.1f s (%d more failed since the last line)",
        )
        while not self.stop.wait(self.settings.lease_s / 3):
            swept = sweep_parked()
            if swept:
                log.warning("unlinked %d parked embedding segment(s) nobody read: %s", len(swept), swept)
            try:
                self.presence.beat(self.snapshot)
                beats_failed.back()
            except Exception as exc:  # noqa: BLE001 - Redis restarting: the next beat retries
                beats_failed.failed(exc)

    def snapshot(self) -> dict:
        c = self.encoder.counters
        self.stats.counters.update(encoder_cache_hits=c.hits, encoder_cache_misses=c.misses)
        if c.hits + c.misses:
            self.stats.set(encoder_cache_hit_rate=c.hits / (c.hits + c.misses))
        tower = self.encoder.tower
        self.stats.memory = {
            "packed_weights": sum(p.numel() * p.element_size() for p in tower.parameters()),
            "encoder_cache": c.cache_bytes,
        }
        return self.stats.snapshot()

    def leave(self) -> None:
        self.presence.leave()

    def stuck(self) -> bool:
        return self.heartbeat.stuck()

    def hand_back(self, until: float) -> None:
        """Nothing held but the encodes on the tasks' threads (each a moment): the warm shutdown waits for
        them, their leases beaten till ``close``; nothing kept for a peer (``until`` unused)."""

    def close(self) -> None:
        """The leases' beats end (parked embeddings belong to their readers, or the sweep)."""
        self._closed.set()

    def handle(self, job: PrefillJob) -> None:
        """Claim the request (``Heartbeat.claim``: its lease kept alive until it is handed on or
        ended), encode its images, park the embeddings and queue it for prefill."""
        rid = job.request.request_id
        unlink_parked_before(rid, job.attempt)  # a lost run's (the prefill worker that took it died)
        if not self.heartbeat.claim(Ticket(job), lambda ticket: self._end(ticket.job, "cancelled")):
            return  # a stale redelivery, ended, cancelled, or a live worker has it
        try:
            self._encode_and_hand_on(job)
        finally:
            self.heartbeat.release(rid)  # (an error on the way: the lease lapses, the reaper re-runs it)

    def _end(self, job: PrefillJob, reason: str, message: str = "") -> None:
        self.heartbeat.release(job.request.request_id)  # no beat in flight outlives the end
        self.store.settle(job.request.request_id, job.attempt, self.name, reason, len(job.generated), message)

    def _encode_and_hand_on(self, job: PrefillJob) -> None:
        rid = job.request.request_id
        self.stats.add(queued_requests=1, queue_seconds=clock.now() - job.request.created)
        try:
            with self._lock, continued(job.request.trace), self.heartbeat.step():
                images = self.encoder.embeddings(self.store.images(rid))
            self.stats.call("vision.encode")
        except (ImageError, ValueError) as exc:
            log.warning("request %s: image refused: %s", rid, exc)
            self.stats.call("vision.encode", failed=True)
            self._end(job, "error", f"image refused: {exc}")
            return
        settings = self.settings
        transport = "redis" if settings.handoff == "redis" else "shm"  # vision and prefill share a host
        ref = publish_tensor(torch.cat(images), rid, transport, self.store, settings.visibility_timeout_s, job.attempt)
        message = self.prefill_message(job.model_copy(update={"embeddings": ref}))
        self.heartbeat.release(rid)  # no beat in flight outlives the hand-on (prefill may claim it at once)
        if not self.store.hand_on(rid, job.attempt, self.name, "prefill", message, settings.visibility_timeout_s):
            log.warning("request %s: its run ended or moved on while its images were encoded", rid)
            discard_tensor(ref, self.store)
