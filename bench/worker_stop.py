"""How long a worker takes to stop: SIGTERM to its exit, per worker, and a whole ``Stack.stop()``.

Starts a stack of 1 prefill and 1 decode worker on the demo checkpoint (text only) per round, serves
one request, then SIGTERMs the decode worker and the prefill worker one after the other (each
waited for), and times a ``Stack.stop()`` of a second stack (gateway, then both workers together,
then Redis). An idle worker's stop is Celery's warm shutdown (its queue read blocked in Redis ended
as the stop begins: it waited for the broker's 1 s poll) and then whatever the process does on its
way out.
``--stops N``: instead, N stops of one stack's workers (decode0 and prefill0 in turn, each restarted by
the supervision and ready again before the next, then 0-1 s at random: a stop lands anywhere in the
consumer's 1 s poll), and how many took longer than the poll (a stop Celery noticed only at its
next read's end).
Run: ``python bench/worker_stop.py [--rounds 3 | --stops 30]``; before/after: run it from each tree's folder with
PYTHONPATH at it (``python -m`` puts the working directory first on the workers' path: from another
folder they import its ``services``).
"""

from __future__ import annotations

import random
import signal
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from demo_stack import running, scratch, stack_on
from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.stack import Stack

ENV = {"DAYZERO_KV_BUDGET_MB": "32", "DAYZERO_MAX_BATCH": "16"}
BODY = {"model": "dayzero-demo", "prompt": [0, 5, 6], "max_tokens": 4}


@contextmanager
def served(checkpoint: Path, logs: Path) -> Iterator[Stack]:
    """A running stack of 1 prefill and 1 decode worker on ``checkpoint`` that has served a request."""
    with running(stack_on(checkpoint, {"vision": 0, "prefill": 1, "decode": 1}, logs, ENV)) as stack:
        assert httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=120).status_code == 200
        yield stack


def rounds(work: Path, n: int) -> dict[str, list[float]]:
    checkpoint = write_demo_checkpoint(work / "ckpt", fp4=True)
    took: dict[str, list[float]] = {"decode0": [], "prefill0": [], "Stack.stop()": []}
    for r in range(n):
        with served(checkpoint, work / f"logs{r}") as stack:
            for name in ("decode0", "prefill0"):
                proc = stack.child(name).proc
                began = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
                took[name].append(time.monotonic() - began)
        with served(checkpoint, work / f"logs{r}-whole") as stack:
            began = time.monotonic()
            killed = stack.stop()  # (timed here; running's own stop after finds nothing left to stop)
            took["Stack.stop()"].append(time.monotonic() - began)
        assert not killed, killed
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in took.items()), flush=True)
    return took


def stops(work: Path, n: int) -> list[float]:
    """``n`` stops of one stack's workers, each restarted and ready again before the next."""
    checkpoint = write_demo_checkpoint(work / "ckpt", fp4=True)
    took = []
    with served(checkpoint, work / "logs") as stack:
        for i in range(n):
            name = ("decode0", "prefill0")[i % 2]
            time.sleep(random.uniform(0, 1))
            proc = stack.child(name).proc
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            took.append(time.monotonic() - began)
            print(f"stop {i}: {name} {took[-1]:.2f} s", flush=True)
            stack.until_ready(name, 300)  # (a stop is a quick exit: from the second one in a row on, a wait first)
    return took


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stops", type=int, default=0, help="N stops of one stack's workers instead of rounds")
    args = ap.parse_args()
    with scratch() as work:  # (the checkpoint, the logs)
        if args.stops:
            took = {"worker stop": stops(work, args.stops)}
            slow = [t for t in took["worker stop"] if t > 1.0]
            print(f"longer than the 1 s poll: {len(slow)} of {args.stops} ({', '.join(f'{t:.2f}' for t in slow)})")
        else:
            took = rounds(work, args.rounds)
    for name, values in took.items():
        print(f"{name}: median {statistics.median(values):.2f} s, min {min(values):.2f}, max {max(values):.2f}")


if __name__ == "__main__":
    main()
