"""How long a handoff decode has not taken holds a prefill worker's blocks, and what a prompt behind it waits.

A prefill loop on the demo checkpoint whose pools hold one sequence (shm handoff: the state stays in
its blocks till decode copies it), with DAYZERO_HANDOFF_TIMEOUT_S ``--timeout`` s and a real Redis.
No decode worker runs; per case, one request is prefilled and handed off, then:
``taken``: a decode takes it at once (``take_handoffs``); ``unclaimed``: nobody reads its message;
``claimed``: a decode claims it (its lease ``--lease`` s) and dies before copying it. Reports per
case the seconds from the handoff (or the take) to its blocks' release, and how long a second
prompt, arriving just after the handoff, waited for them.
Run: ``python bench/handoff_hold.py [--timeout 5] [--lease 2]``.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.params import SamplingParams
from dayzero.procs import scratch_redis
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.queue import composer, make_celery
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings


def admitted(store: Lifecycle, rid: str) -> PrefillJob:
    sampling = SamplingParams(max_tokens=4)
    request = GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6, 7, 8), sampling=sampling, created=time.time())
    store.admit(request, [], "", 600)
    return PrefillJob(request=request)


def case(loop: PrefillLoop, store: Lifecycle, how: str, lease_s: float) -> tuple[float, float]:
    """-> (seconds from the handoff, or the take, to the blocks' release; the next prompt's wait)."""
    first, behind = f"{how}-first", f"{how}-behind"
    assert loop.intake.submit(admitted(store, first)).done.wait(60)
    start = time.monotonic()
    if how == "taken":
        store.take_handoffs([(first, 0, loop.r.name)], "decode0@bench", 30)
    elif how == "claimed":
        store.take(first, 0, "decode0@bench", lease_s, handed_off=True)  # and never beats again
    waiting = loop.intake.submit(admitted(store, behind))
    while first in loop.r.pools.sequences:
        time.sleep(0.005)
    freed = time.monotonic() - start
    assert waiting.done.wait(120)
    waited = time.monotonic() - start
    store.take_handoffs([(behind, 0, loop.r.name)], "decode0@bench", 30)  # (the next case's blocks)
    while behind in loop.r.pools.sequences:
        time.sleep(0.005)
    return freed, waited


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_redis(Path(tmp)) as port:
        url = f"redis://127.0.0.1:{port}/0"
        checkpoint = write_demo_checkpoint(Path(tmp) / "demo", fp4=True)
        settings = Settings(
            checkpoint=checkpoint, redis_url=url, kv_budget_mb=1, max_batch=1, handoff_timeout_s=args.timeout
        )
        runtime = Runtime.load(settings, "prefill-hold@bench", "prefill", False)
        loop, store = PrefillLoop(runtime, composer(make_celery(settings), "decode")), Lifecycle.connect(url)
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            rows = {how: case(loop, store, how, args.lease) for how in ("taken", "unclaimed", "claimed")}
        finally:
            loop.stop.set()
            thread.join(30)
            runtime.close()
    print(f"DAYZERO_HANDOFF_TIMEOUT_S {args.timeout:g} s, decode's lease {args.lease:g} s; pools: one sequence")
    print("| handoff | blocks freed after | the next prompt waited |")
    print("|---|---:|---:|")
    for how, (freed, waited) in rows.items():
        print(f"| {how} | {freed:.3f} s | {waited:.3f} s |")


if __name__ == "__main__":
    main()
