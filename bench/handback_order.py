"""Prefill's hand-back under load: where a handed-back prompt lands in a long queue.

A prefill worker (the demo checkpoint, in-process, its pools full) claims a prompt; N newer prompts
are admitted behind it, their messages on prefill's queue (a real Redis, as the gateway admits
them); a live peer's snapshot shows room, so the worker hands the old prompt back. Then the queue is
read as the workers' consumers read it (BRPOP, one message at a time): how many of the N newer
prompts are read, so claimed and served, before the handed-back one. It was admitted before all of
them (first come, first served orders it first only once it is claimed again). Every message's
mark is checked as the reaper reads it: waiting while its message waits, gone once read.
Run: ``python bench/handback_order.py [--newer 1 8 64]``.
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
from pathlib import Path

from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.params import SamplingParams
from dayzero.procs import scratch_redis
from dayzero.serving.admission import Queue, Record, admission
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.prefilling import tokens_of
from dayzero.serving.queue import composer, make_celery
from dayzero.serving.queue_scripts import ADMIT
from dayzero.serving.registry import Registry
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings


def admit(store: Lifecycle, rid: str, compose) -> PrefillJob:
    """A 300-token prompt admitted as the gateway admits it, its message pushed onto prefill's queue."""
    request = GenerationRequest(
        request_id=rid, prompt_ids=tuple(range(2, 302)), sampling=SamplingParams(max_tokens=4), created=time.time()
    )
    job = PrefillJob(request=request)
    keys, args = admission([Record.of(request)], [], "", 60, 600, Queue("prefill", (compose(job),)))
    store.r.register_script(ADMIT)(keys=keys, args=args)
    return job


def request_id(message: bytes) -> str:
    """The request id in a prefill task message (kombu's envelope, Celery's protocol 2 body)."""
    args, _, _ = json.loads(base64.b64decode(json.loads(message)["body"]))
    return json.loads(args[0])["request"]["request_id"]


def waits(store: Lifecycle, rid: str) -> bool:
    """Whether the reaper reads the request's mark as a message still waiting in its queue (a message
    gone, seen a first time, is only noted: the sighting is cleared again)."""
    assert store.rerun_orphan(rid, 60, 60) == 0
    return not store.r.delete(key("orphan", rid))


def trial(ckpt: Path, url: str, newer: int) -> dict:
    store = Lifecycle.connect(url)
    store.r.flushdb()
    settings = Settings(checkpoint=ckpt, redis_url=url, kv_budget_mb=1, max_batch=4, lease_s=30, max_context=3000)
    runtime = Runtime.load(settings, "prefill0@bench", "prefill", False)
    compose = composer(make_celery(settings), "prefill")
    room = Room(runtime, Prefetch(), to_prefill(runtime, compose))
    loop = PrefillLoop(runtime, composer(make_celery(settings), "decode"), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())  # its pools full
    empty = {kind: [0, total] for kind, (_, total) in runtime.pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill1@bench:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    try:
        old = admit(store, "old", compose)
        assert request_id(store.r.brpop(["prefill"], 5)[1]) == "old"  # this worker's read takes it
        loop.intake.submit(old)  # and claims it
        for i in range(newer):
            admit(store, f"new-{i}", compose)
        assert room.hand_back(loop.intake.drain(0), tokens_of, loop.heartbeat) == []
        queued, read, marks_true = {"old", *(f"new-{i}" for i in range(newer))}, [], True
        while message := store.r.brpop(["prefill"], 1):
            read.append(request_id(message[1]))
            queued.discard(read[-1])
            marks_true &= all(waits(store, rid) for rid in queued) and not waits(store, read[-1])
    finally:
        loop.stop.set()
    return {"newer": newer, "read_before_it": read.index("old"), "read": len(read), "marks_true": marks_true}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--newer", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_redis(Path(tmp)) as port:
        ckpt = write_demo_checkpoint(Path(tmp) / "ckpt", fp4=True)
        for newer in args.newer:
            print(trial(ckpt, f"redis://127.0.0.1:{port}/0", newer), flush=True)


if __name__ == "__main__":
    main()
