"""What one large request body costs the gateway's event loop while ``json_body.parse`` reads it: the
body's parse (and, nested too deep, the scan for where), its wall time, the CPU it took (the process's,
thread pool included), and the longest the event loop went without running a probe that wakes every
millisecond (a concurrent request's stall). Bodies of ``--mb`` MiB, the gateway's default limit 8:

- ``token ids``: one prompt of token ids (a request the gateway serves);
- ``content parts``: 256 messages of 1,024 empty text parts (refused after the parse: 4,096 in all);
- ``one-id arrays``: a prompt of ``[1]`` arrays, ~2 M containers (refused after the parse);
- ``deep after arrays``: ``[],`` for all but the end, then arrays nested past the parser's depth
  (refused at the parse, with the position of the first bracket too deep).

The gateway's modules are imported first (its heap: a collection of it is part of what a body costs).
Medians of ``--runs``. Compare two commits back to back: run it in each one's checkout (it imports
the gateway of the tree it is in, whichever tree the venv installed).

    .venv/bin/python bench/body_parse.py [--mb 8] [--runs 5] [--only NAME ...]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from options import bench_parser

TREE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TREE / "shared"), str(TREE)]  # (ahead of the venv's editable install: maybe another tree)
import services.gateway.app  # noqa: E402, F401  (the gateway's heap)
from services.gateway.json_body import parse  # noqa: E402

PROBE_S = 0.001


def bodies(mb: int) -> dict[str, bytes]:
    size = mb << 20
    ids = json.dumps({"model": "m", "prompt": list(range(1_000_000, 1_000_000 + size // 9))}).encode()
    part = '{"type": "text", "text": ""}, '
    per_message = size // 256 // len(part)
    message = '{"role": "user", "content": [' + part * (per_message - 1) + part[:-2] + "]}"
    parts = ('{"model": "m", "messages": [' + ", ".join([message] * 256) + "]}").encode()
    arrays = b'{"model": "m", "prompt": [' + b"[1]," * (size // 4 - 8) + b"[1]]}"
    deep = b"[" + b"[]," * (size // 3 - 800) + b"[" * 2000
    return {"token ids": ids, "content parts": parts, "one-id arrays": arrays, "deep after arrays": deep}


async def _probe(stop: asyncio.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(PROBE_S)
        worst = max(worst, time.perf_counter() - began - PROBE_S)
    return worst


async def one_parse(body: bytes) -> tuple[float, float, float, str]:
    """(wall s, CPU s, the loop's longest stall s, how it ended)."""
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(stop))
    await asyncio.sleep(0.02)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        await parse(body)
        ended = "parsed"
    except Exception as exc:  # the 400 a body nested too deep gets
        ended = type(exc).__name__
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await asyncio.sleep(0.02)
    stop.set()
    return wall, cpu, await probe, ended


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--mb", type=int, default=8, help="body size in MiB")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="body names to run (default: all)")
    args = parser.parse_args()
    print(f"| body ({args.mb} MiB) | ends | wall s | CPU s | loop's longest stall s |")
    print("|---|---|---|---|---|")
    for name, body in bodies(args.mb).items():
        if args.only and name not in args.only:
            continue
        runs = [asyncio.run(one_parse(body)) for _ in range(args.runs)]
        wall, cpu, stall = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"| {name} | {runs[0][3]} | {wall:.3f} | {cpu:.3f} | {stall:.3f} |", flush=True)


if __name__ == "__main__":
    main()
