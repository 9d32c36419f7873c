"""Time to first token (and to the second) of two source trees side by side: a change to the serving
path, A/B.

Starts one idle stack per tree (embedded Redis, gateway, 1 prefill + 1 decode worker, demo
checkpoint; each stack's processes import that tree's ``shared/`` and ``services/``) and sends
them the same streamed completion in turns, the order swapped every round, from a minimal client
(``sse_clients.RawClient``), with an in-process prefill between rounds as the other benchmarks do.
Both stacks see the same machine at the same time, so the paired difference of their TTFTs
carries far less noise than two runs of ``overhead.py`` one after the other (whose overhead
moved by ~1 ms from stack to stack here). The gap from the first token to the second (decode's
first: the handoff to decode and its admission) is reported the same way. Run it with the same
tree twice to see the noise left. Run: ``python bench/ttft_ab.py TREE_A TREE_B [--requests 80]``
(e.g. a ``git worktree`` of main against the working tree).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from demo_stack import stack_on
from options import bench_parser
from overhead import Engine
from sse_clients import RawClient

from dayzero.demo import write_demo_checkpoint
from dayzero.stack import Stack


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (each with shared/ and services/)")
    parser.add_argument("--requests", type=int, default=80, help="requests to each stack")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the children's working directory leads their sys.path (python -m): not a tree
        checkpoint = write_demo_checkpoint(Path(tmp) / "demo")
        engine = Engine(checkpoint)
        prompt = engine.text_prompt(args.prompt_tokens)
        with trees_running(tree_stacks(args.trees, checkpoint, Path(tmp))) as stacks:
            ttft, gaps = rounds([RawClient(s.url) for s in stacks], engine, prompt, args.requests)
    print(f"A streamed {args.prompt_tokens}-token completion of 2 tokens, {args.requests} requests each, alternated")
    for title, values in (("TTFT", ttft), ("first -> second token (decode's first)", gaps)):
        print(f"\n{title}\n| tree | p25 ms | p50 ms | p75 ms |\n|---|---:|---:|---:|")
        for tree, times in zip(args.trees, values, strict=True):
            q1, q2, q3 = statistics.quantiles(times, n=4)
            print(f"| {tree} | {q1:.2f} | {q2:.2f} | {q3:.2f} |")
        paired = statistics.median(b - a for a, b in zip(*values, strict=True))
        print(f"paired difference, B - A: median {paired:+.2f} ms")


def tree_stacks(
    trees: list[Path], checkpoint: Path, folder: Path, own: Callable[[int], dict] | None = None
) -> list[Stack]:
    """A stack per tree, not started, whose processes import that tree's ``shared/`` and ``services/``
    (its logs in ``folder``); ``own(i)``: the i-th stack's settings of its own."""
    stacks = []
    for i, tree in enumerate(trees):
        tree = tree.resolve()
        settings = {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tree / 'shared'}:{tree}", **(own(i) if own else {})}
        stacks.append(stack_on(checkpoint, {"prefill": 1, "decode": 1}, folder / f"logs{i}", settings))
    return stacks


@contextmanager
def trees_running(stacks: list[Stack]) -> Iterator[list[Stack]]:
    """``stacks`` started side by side and ready; stopped after."""
    try:
        for stack in stacks:
            stack.start()
        for stack in stacks:
            stack.wait_ready(timeout_s=300)
        yield stacks
    finally:
        for stack in stacks:
            stack.stop()


def alternated(clients: list[RawClient], engine: Engine, prompt: list[int], n: int) -> list[list[dict]]:
    """Each round one request to each stack (first A then B, then B then A, ...) -> each stack's sends."""
    for client in clients:
        for _ in range(3):  # warm-up: connections, first-call paths
            client.stream(prompt)
    sent: list[list[dict]] = [[], []]
    for k in range(n):
        for i in (0, 1) if k % 2 == 0 else (1, 0):
            sent[i].append(clients[i].stream(prompt))
            time.sleep(0.05)  # decode's token and the stream's end settle
        engine.first_token(prompt)
        time.sleep(0.05)
    for client in clients:
        client.close()
    return sent


def rounds(
    clients: list[RawClient], engine: Engine, prompt: list[int], n: int
) -> tuple[list[list[float]], list[list[float]]]:
    """``alternated`` -> each stack's TTFTs and first -> second token gaps (decode's first token), ms."""
    sent = alternated(clients, engine, prompt, n)
    ttft = [[(s["first"] - s["send"]) / 1e6 for s in tree] for tree in sent]
    gaps = [[(s["second"] - s["first"]) / 1e6 for s in tree] for tree in sent]
    return ttft, gaps


if __name__ == "__main__":
    main()
