"""What validating one chat body costs the gateway's event loop (``ChatCompletionRequest.model_validate``,
which runs on it) for bodies of ``--keys`` unknown keys, each holding one kind of value: a key sent as
null is a required field's fault or an optional one's default, looked up before pydantic sees the body
(afb62f2: a scan of the fields for each null key, 4.5 s for 600 k, before a cached set); an integral
float is looked up among the integer fields (a cached set too: it read ``model_fields`` per key, 3x
the cost of an integer's); the others go on to pydantic. Medians of ``--runs``; run it in two
checkouts to compare commits (it imports the gateway of the tree it is in).

    .venv/bin/python bench/body_validate.py [--keys 300000] [--runs 5]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from options import bench_parser

TREE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TREE / "shared"), str(TREE)]  # (ahead of the venv's editable install: maybe another tree)
from services.gateway.chat_schemas import ChatCompletionRequest  # noqa: E402

VALUES = {"null": None, "0": 0, "1.0": 1.0, '"x"': "x"}


def validate_s(keys: int, value: object) -> float:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **{f"k{i}": value for i in range(keys)}}
    start = time.perf_counter()
    ChatCompletionRequest.model_validate(body)
    return time.perf_counter() - start


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--keys", type=int, default=300_000, help="unknown keys in the body")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"| {args.keys:,} unknown keys holding | validate s (median of {args.runs}) |")
    print("|---|---:|")
    for name, value in VALUES.items():
        seconds = statistics.median(validate_s(args.keys, value) for _ in range(args.runs))
        print(f"| {name} | {seconds:.3f} |", flush=True)


if __name__ == "__main__":
    main()
