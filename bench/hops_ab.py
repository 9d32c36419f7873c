"""The pipeline's hops of two source trees side by side, from their spans: a change to the serving
path, A/B, without the forward's noise.

Starts one idle traced stack per tree (console exporter; embedded Redis, gateway, 1 prefill + 1
decode worker, demo checkpoint; each stack's processes import that tree's ``shared/`` and
``services/``) and sends them the same streamed completion in turns, the order swapped every round,
from a minimal client, with an in-process prefill between rounds, as ``ttft_ab.py`` does. On a
loaded machine the forward's time moves by more than the whole pipeline costs (two runs of the
same tree in ttft_ab.py differed by 7 ms of TTFT at load 9): here each request's TTFT is also
given less its forward and first-token sampling (``prefill.forward``'s start to the first token's
XADD), the time the pipeline itself adds, and each hop of ``overhead.py`` (a tree from before a
hop's mark shows none). Run it with the same tree twice to see the noise left. Run: ``python
bench/hops_ab.py TREE_A TREE_B [--requests 40]`` (e.g. a ``git worktree`` of main against the
working tree).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from options import bench_parser
from overhead import HOPS, Engine, hops, span_marks
from sse_clients import RawClient
from ttft_ab import alternated, tree_stacks, trees_running

from dayzero.demo import write_demo_checkpoint

PIPELINE = "TTFT less forward + first-token sampling"
INTAKE = "prefill intake (task -> forward starts: claim + loop pickup)"  # (a tree from before the claim's mark has it)
# the worker's whole share up to the forward, whichever thread starts the task span (a tree that claims before it)
QUEUED_TO_FORWARD = "enqueue sent -> forward starts (queue hop + intake)"


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (each with shared/ and services/)")
    parser.add_argument("--requests", type=int, default=40, help="requests to each stack")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the children's working directory leads their sys.path (python -m): not a tree
        checkpoint = write_demo_checkpoint(Path(tmp) / "demo")
        engine = Engine(checkpoint)
        prompt = engine.text_prompt(args.prompt_tokens)
        folders = [Path(tmp) / f"spans{i}" for i in (0, 1)]
        for folder in folders:
            folder.mkdir()

        def traced(i: int) -> dict[str, str]:
            return {"DAYZERO_TRACE_EXPORTER": "console", "DAYZERO_TRACE_FILE": str(folders[i])}

        with trees_running(tree_stacks(args.trees, checkpoint, Path(tmp), traced)) as stacks:
            sent = alternated([RawClient(s.url) for s in stacks], engine, prompt, args.requests)
            time.sleep(1.5)  # the last spans reach their files
        marked = [span_marks(folder, requests, whole=False) for folder, requests in zip(folders, sent, strict=True)]
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    table(args, marked)


def table(args, marked: list[list[dict]]) -> None:
    """Each hop's median per tree, TTFT's and the pipeline's own time's, and B - A."""
    rows: list[list[dict[str, float]]] = [[], []]
    for i, requests in enumerate(marked):
        for m in requests:
            row = {**hops(m), "TTFT": (m["first"] - m["send"]) / 1e6}
            if m["task"] is not None and m["forward"] is not None:
                row[INTAKE] = (m["forward"] - m["task"]) / 1e6
            if m["queued"] is not None and m["forward"] is not None:
                row[QUEUED_TO_FORWARD] = (m["forward"] - m["queued"]) / 1e6
            if m["forward"] is not None and m["published"] is not None:
                row[PIPELINE] = row["TTFT"] - (m["published"] - m["forward"]) / 1e6
            rows[i].append(row)
    print(f"\nA streamed {args.prompt_tokens}-token completion of 2 tokens, alternated; requests with spans: ", end="")
    print(" / ".join(str(len(r)) for r in rows))
    print(f"A: {args.trees[0]}, B: {args.trees[1]}\n| ms (p50) | A | B | B - A |\n|---|---:|---:|---:|")
    for name in [h[0] for h in HOPS] + [INTAKE, QUEUED_TO_FORWARD, "TTFT", PIPELINE]:
        a, b = ([r[name] for r in tree if name in r] for tree in rows)
        if a or b:
            p50 = [f"{statistics.median(v):.2f}" if v else "-" for v in (a, b)]
            diff = f"{statistics.median(b) - statistics.median(a):+.2f}" if a and b else "-"
            print(f"| {name} | {p50[0]} | {p50[1]} | {diff} |")


if __name__ == "__main__":
    main()
