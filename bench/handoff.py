"""KV handoff bandwidth: ``import_state`` from a shared-memory segment vs a plain memory copy.

One sequence's whole attention state (window ring, compressed entries, indexer keys,
compressor state) is copied from a prefill-side segment (attached as decode attaches it)
into decode's own pools; the plain copy moves the same number of bytes between two
contiguous tensors. The two are timed interleaved, median of ``--runs``. The pools are
filled with random values (the copy does not depend on them). Run:
``python bench/handoff.py [--runs 9]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dayzero.config import ModelConfig
from dayzero.demo import DEMO_CONFIG
from dayzero.kv.handoff import export_state, import_state
from dayzero.kv.layout import PoolLayout
from dayzero.kv.pools import KVPools
from dayzero.kv.shared import SharedPools

CASES = (("demo", 4096), ("demo", 65536), ("V4-Flash", 4096))


def _config(name: str) -> ModelConfig:
    return ModelConfig.from_dict(DEMO_CONFIG if name == "demo" else {"model_type": "deepseek_v4"})


def bandwidth(cfg: ModelConfig, tokens: int, dtype: torch.dtype, runs: int) -> tuple[float, float, int]:
    """(handoff bytes/s, plain copy bytes/s, bytes moved) for one sequence of ``tokens`` tokens."""
    layout = PoolLayout.of(cfg, 16, str(dtype).removeprefix("torch."))
    blocks = KVPools.sized(layout, tokens, 1, dtype, device="meta").blocks
    src, segment = SharedPools.create(layout, blocks, dtype)
    view, view_segment = SharedPools.attach(src.pool_id, layout, blocks, dtype)
    try:
        src.reserve("s", tokens)
        src.sequences["s"].length = tokens
        for tensor in src.tensors():
            tensor.copy_(torch.randn(tensor.shape))
        handle = export_state(src, "s")
        dst = KVPools(layout, blocks, dtype)
        moved = src.sequence_bytes("s")
        flat, target = torch.ones(moved, dtype=torch.uint8), torch.empty(moved, dtype=torch.uint8)
        handoffs, copies = [], []
        for _ in range(runs + 1):  # interleaved; the first of each is a warm-up
            dst.release("d")
            start = time.perf_counter()
            import_state(dst, view, handle, "d")
            handoffs.append(time.perf_counter() - start)
            start = time.perf_counter()
            target.copy_(flat)
            copies.append(time.perf_counter() - start)
        assert dst.sequence_bytes("d") == moved
        return moved / statistics.median(handoffs[1:]), moved / statistics.median(copies[1:]), moved
    finally:
        del src, view
        view_segment.close()
        segment.close()
        segment.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"KV handoff (shared memory -> own pools) vs plain memory copy, CPU, median of {args.runs}")
    print("| model | dtype | tokens | state MB | handoff GB/s | memcpy GB/s | handoff / memcpy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, tokens in CASES:
        dtype = torch.float32 if name == "demo" else torch.bfloat16
        handoff, copy, moved = bandwidth(_config(name), tokens, dtype, args.runs)
        print(
            f"| {name} | {str(dtype).removeprefix('torch.')} | {tokens} | {moved / 1e6:.2f} | "
            f"{handoff / 1e9:.2f} | {copy / 1e9:.2f} | {handoff / copy:.2f}x |"
        )


if __name__ == "__main__":
    main()
