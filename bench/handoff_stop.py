"""A prefill worker stopped (SIGTERM) right after it handed off N requests, their states kept in its
shm pool segment (DAYZERO_HANDOFF=shm) and not copied by decode yet: how many decode lost (its attach
failed: the segment was gone) and the reaper re-ran from scratch.

1 prefill and 1 decode worker on the demo checkpoint. Decode is frozen (SIGSTOP) while prefill hands
the N requests off (each one's handoff mark written), prefill gets SIGTERM, and decode goes on
``--decode-after`` s later (a busy decode worker). Per trial: the handoffs decode lost (its
"handoff failed" lines), the requests the reaper re-ran ("lost its worker"), the prefill worker's exit
after its SIGTERM. Run: ``python bench/handoff_stop.py [--requests 8] [--trials 2]``.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import httpx
import redis
from demo_stack import running, scratch, stack_on
from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.serving.keys import key

ENV = {"DAYZERO_LEASE_S": "1.0", "DAYZERO_MAX_BATCH": "32", "DAYZERO_HANDOFF": "shm"}


def complete(url: str, prompt: list[int], ids: list[str]) -> None:
    body = {"model": "dayzero-demo", "prompt": prompt, "max_tokens": 4, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        ids.append(response.headers["x-request-id"])
        for _ in response.iter_lines():
            pass


def trial(ckpt: Path, log_dir: Path, requests: int, decode_after_s: float) -> dict:
    with running(stack_on(ckpt, {"vision": 0, "prefill": 1, "decode": 1}, log_dir, ENV), ready_s=240) as stack:
        r, ids = redis.Redis.from_url(stack.redis_url), []
        decode, prefill = stack.child("decode0").proc, stack.child("prefill0").proc
        decode.send_signal(signal.SIGSTOP)
        threads = [
            threading.Thread(target=complete, args=(stack.url, [0, i + 2, 7, 9], ids), daemon=True)
            for i in range(requests)
        ]
        for thread in threads:
            thread.start()
        deadline = time.time() + 60
        while time.time() < deadline and sum(r.exists(key("handoff", rid)) for rid in list(ids)) < requests:
            time.sleep(0.01)
        stopped = time.time()
        prefill.send_signal(signal.SIGTERM)
        time.sleep(decode_after_s)
        decode.send_signal(signal.SIGCONT)
        prefill.wait(30)
        exit_s = time.time() - stopped
        time.sleep(5.0)  # leases lapse (1 s) and the reaper sweeps
        decode_log, gateway_log = (log_dir / "decode0.log").read_text(), (log_dir / "gateway.log").read_text()
    return {
        "handed_off": requests,
        "lost_by_decode": len(re.findall(r"handoff failed: prefill's pool segment", decode_log)),
        "re_run": len(re.findall(r"lost its worker", gateway_log)),
        "prefill_exit_s": round(exit_s, 2),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--decode-after", type=float, default=1.0, help="decode goes on this long after the SIGTERM")
    parser.add_argument("--keep", default="", help="a folder for the stacks' logs (else a temporary one)")
    args = parser.parse_args()
    with scratch(args.keep) as tmp:
        ckpt = write_demo_checkpoint(tmp / "ckpt", fp4=True)
        for i in range(args.trials):
            print(trial(ckpt, tmp / f"logs{i}", args.requests, args.decode_after), flush=True)


if __name__ == "__main__":
    main()
