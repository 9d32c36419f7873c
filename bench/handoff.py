"""KV handoff bandwidth: decode's ``Receiver.receive`` of prefill's published state vs a plain memory copy.

One sequence's whole attention state (window ring, compressed entries, indexer keys,
compressor state) is written by this process into shared pools and published, as prefill's
are; a process of its own then receives it as decode does (its first receive attaches the
shared-memory segment, or on a GPU the CUDA IPC allocation: its exporter cannot open it; the
others copy the state into its own pools, what decode times as handoff_seconds), timed
interleaved with a plain copy of as many bytes between two contiguous tensors on the same
device (``copy``: torch's, on a CPU with torch's threads, two by default; ``memcpy``: on a CPU one thread's,
libc's memmove, which is what the handoff's compiled copy is, between a pair of tensors of its own: each
of the three finds its bytes as the other two's runs left the caches; on a GPU the two are one device copy),
median of ``--runs`` after ``--warmup`` receives not counted (CUDA-synchronised; the first
attaches; a decode worker imports thousands of states: the warm ones are its steady state, and
``--warmup 1`` a fresh process's first). The 16-token state is the handoff's fixed cost: its copy
is a few microseconds. The decode side reads the state's message from its JSON
each time, as decode's task does (``parse us``: outside handoff_seconds); ``--ids`` is how the
message names the blocks (DAYZERO_HANDOFF_IDS: int64 bytes, the default, or lists). The pools hold random
values (the copy does not depend on them). ``--transport cuda_ipc`` needs a GPU (bench/gpu.sh
runs it; without one: a message, exit 0). Run:
``python bench/handoff.py [--runs 9] [--warmup 10] [--transport shm|cuda_ipc] [--ids bytes|lists] [--profile]
[--tokens 4096]``.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import statistics
import time
from multiprocessing import resource_tracker

import torch
from options import bench_parser, need_cuda

from dayzero.config import ModelConfig
from dayzero.demo import DEMO_CONFIG
from dayzero.kv.layout import PoolLayout
from dayzero.kv.pools import KVPools
from dayzero.kv.shared import CudaSharedPools, SharedPools
from dayzero.serving.handoff import Receiver, publish
from dayzero.serving.messages import StateRef

CASES = (("demo", 16), ("demo", 4096), ("demo", 65536), ("V4-Flash", 4096))
GPU_CASES = (*CASES, ("V4-Flash", 65536))  # 0.7 GB of state: on a GPU only


def _config(name: str) -> ModelConfig:
    return ModelConfig.from_dict(DEMO_CONFIG if name == "demo" else {"model_type": "deepseek_v4"})


def _decode_side(
    transport: str,
    layout: PoolLayout,
    dtype: torch.dtype,
    message: str,
    moved: int,
    runs: int,
    warmup: int,
    profiled: bool,
    out,
) -> None:
    """In a process of its own, as decode: read the state's ``message`` and receive it
    ``warmup + runs`` times (the first attaches; the ``warmup`` first are not counted) interleaved
    with plain copies of the ``moved`` bytes; puts (handoff s, copy s, memcpy s, parse s) medians and, when
    ``profiled``, the profiler's table of one more receive."""
    device = "cuda" if transport == "cuda_ipc" else "cpu"
    receiver = Receiver(store=None)  # (the store serves the redis transport only)
    ref = StateRef.model_validate_json(message)
    dst = KVPools(layout, ref.pool_blocks, dtype, device)
    flat = torch.ones(moved, dtype=torch.uint8, device=device)
    target = torch.empty_like(flat)
    # (memmove after torch's copy of the same bytes found them cached: 64k 228-310 us, 652-689 on a pair of its own)
    memmove_from, memmove_to = (torch.ones_like(flat), torch.empty_like(flat)) if device == "cpu" else (None, None)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    handoffs, copies, memcpys, parses = [], [], [], []
    for _ in range(warmup + runs):
        dst.release("d")
        start = time.perf_counter()
        ref = StateRef.model_validate_json(message)
        parses.append(time.perf_counter() - start)
        sync()
        start = time.perf_counter()
        receiver.receive(ref, dst, "d")
        sync()
        handoffs.append(time.perf_counter() - start)
        start = time.perf_counter()
        target.copy_(flat)
        sync()
        copies.append(time.perf_counter() - start)
        if device == "cpu":
            start = time.perf_counter()
            ctypes.memmove(memmove_to.data_ptr(), memmove_from.data_ptr(), moved)
            memcpys.append(time.perf_counter() - start)
    assert dst.sequence_bytes("d") == moved
    profile = _profiled(dst, receiver, ref, sync) if profiled else ""
    receiver.close()
    memcpys = memcpys or copies  # (a GPU's device copy is its memcpy)
    out.put((*(statistics.median(times[warmup:]) for times in (handoffs, copies, memcpys, parses)), profile))


def _profiled(dst: KVPools, receiver: Receiver, ref: StateRef, sync) -> str:
    """torch.profiler's table of one receive: where its time goes, on the host (and the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    dst.release("d")
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dst.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        receiver.receive(ref, dst, "d")
        sync()
    order = "self_device_time_total" if dst.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=order, row_limit=12)


def bandwidth(
    cfg: ModelConfig,
    tokens: int,
    dtype: torch.dtype,
    runs: int,
    transport: str = "shm",
    profiled: bool = False,
    ids: str = "bytes",
    warmup: int = 10,
) -> tuple[float, float, float, int, float, str]:
    """(handoff bytes/s, plain copy bytes/s, one-thread memcpy bytes/s, bytes moved, message parse s,
    profile) for one sequence of ``tokens`` tokens."""
    layout = PoolLayout.of(cfg, 16, str(dtype).removeprefix("torch."))
    blocks = KVPools.sized(layout, tokens, 1, dtype, device="meta").blocks
    if transport == "cuda_ipc":
        src, segment = CudaSharedPools.create(layout, blocks, dtype, "cuda"), None
    else:
        src, segment = SharedPools.create(layout, blocks, dtype)
    try:
        src.reserve("s", tokens)
        src.sequences["s"].length = tokens
        for tensor in src.tensors():
            tensor.copy_(torch.randn(tensor.shape, device=tensor.device))
        moved = src.sequence_bytes("s")
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        message = publish(src, "s", "bench", transport, store=None, ttl_s=600, ids=ids).model_dump_json()
        args = (transport, layout, dtype, message, moved, runs, warmup, profiled, out)
        child = context.Process(target=_decode_side, args=args)
        child.start()
        handoff, copy, memcpy, parse, profile = out.get(timeout=600)
        child.join(60)
        return moved / handoff, moved / copy, moved / memcpy, moved, parse, profile
    finally:
        del src
        if segment is not None:
            segment.close()
            # the child's attach took the name off the resource tracker the two processes share
            resource_tracker.register(segment._name, "shared_memory")  # noqa: SLF001 - unlink takes it off again
            segment.unlink()


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument(
        "--warmup", type=int, default=10, help="receives not counted before the runs (the first attaches): at least 1"
    )
    parser.add_argument("--transport", choices=("shm", "cuda_ipc"), default="shm")
    parser.add_argument(
        "--profile", action="store_true", help="cuda_ipc: after the table, one import profiled per case"
    )
    parser.add_argument("--ids", choices=("bytes", "lists"), default="bytes", help="how the message names the blocks")
    parser.add_argument("--tokens", type=int, nargs="+", help="only the cases of these sequence lengths (default: all)")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup: at least 1 (the first receive attaches the state's memory)")
    if args.transport == "cuda_ipc":
        need_cuda("bench/handoff.py --transport cuda_ipc")
    torch.manual_seed(0)
    where = "GPU, CUDA IPC" if args.transport == "cuda_ipc" else "CPU, shared memory"
    print(
        f"KV handoff (decode receives prefill's published state, in another process) vs a plain copy, {where}, "
        f"block ids as {args.ids}, median of {args.runs} after {args.warmup} not counted"
    )
    print(
        "| model | dtype | tokens | state MB | parse us | handoff us | copy us | memcpy us | handoff GB/s | copy GB/s "
        "| ratio (vs copy) | vs memcpy |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    profiles = []
    cases = GPU_CASES if args.transport == "cuda_ipc" else CASES
    for name, tokens in [(name, tokens) for name, tokens in cases if tokens in (args.tokens or [tokens])]:
        dtype = torch.float32 if name == "demo" else torch.bfloat16
        handoff, copy, memcpy, moved, parse, profile = bandwidth(
            _config(name), tokens, dtype, args.runs, args.transport, args.profile, args.ids, args.warmup
        )
        print(
            f"| {name} | {str(dtype).removeprefix('torch.')} | {tokens} | {moved / 1e6:.2f} | {parse * 1e6:.1f} | "
            f"{moved / handoff * 1e6:.1f} | {moved / copy * 1e6:.1f} | {moved / memcpy * 1e6:.1f} | "
            f"{handoff / 1e9:.2f} | {copy / 1e9:.2f} | {handoff / copy:.2f}x | {handoff / memcpy:.2f}x |"
        )
        profiles.append(f"\n{name}, {tokens} tokens: one import\n{profile}" if profile else "")
    print("".join(profiles), end="")


if __name__ == "__main__":
    main()
