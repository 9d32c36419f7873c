"""Does one request's grammar compile stall the others' streams? A stack of 1 prefill and 1 decode
worker on the demo checkpoint; a plain greedy request streams ``--tokens`` tokens, and once ``--after``
have come a second request asks for a JSON reply following a schema of ``--properties`` required
properties (compiling it takes seconds: bench/guided_compile.py). Reports, per trial, the plain
stream's longest gap between two tokens and its median gap, and the constrained request's status
and time. Before grammars compiled off the loops, decode compiled it on its loop: the plain
stream's gap was the compile.

    .venv/bin/python bench/guided_stall.py [--properties 4000] [--trials 2]
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx
from demo_stack import demo_stack, scratch
from options import bench_parser

from dayzero.stack import Stack

MODEL = "dayzero-demo"


def trial(stack: Stack, tokens: int, after: int, properties: int, salt: int) -> dict:
    plain = {"model": MODEL, "prompt": [0, 5, 4, 3, 2], "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    props = {f"p{salt}_{j}": {"type": "integer"} for j in range(properties)}  # a new schema each trial
    # required: past ~500 optional properties the gateway refuses the schema (400, parser limit)
    schema = {"name": "wide", "schema": {"type": "object", "properties": props, "required": list(props)}}
    guided = {**plain, "max_tokens": 8, "response_format": {"type": "json_schema", "json_schema": schema}}
    arrivals, answer = [], {}

    def constrained() -> None:
        start = time.time()
        r = httpx.post(f"{stack.url}/v1/completions", json=guided, timeout=300)
        answer.update(status=r.status_code, seconds=time.time() - start)

    thread = threading.Thread(target=constrained)
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**plain, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.time())
                if len(arrivals) == after:
                    thread.start()
    thread.join()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {"gap": max(gaps), "median": statistics.median(gaps), **answer}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--properties", type=int, default=4000)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    with scratch() as tmp, demo_stack(tmp, {"vision": 0, "prefill": 1, "decode": 1}, {"OMP_NUM_THREADS": "1"}) as stack:
        rows = [trial(stack, args.tokens, args.after, args.properties, i) for i in range(args.trials)]
    print(f"a plain stream of {args.tokens} tokens; after {args.after}, a schema of {args.properties} properties")
    print("| trial | plain: longest gap | plain: median gap | constrained: status | constrained: s |")
    print("|---:|---:|---:|---:|---:|")
    for i, row in enumerate(rows):
        print(f"| {i} | {row['gap']:.2f} s | {row['median'] * 1e3:.1f} ms | {row['status']} | {row['seconds']:.2f} |")


if __name__ == "__main__":
    main()
