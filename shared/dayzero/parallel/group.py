"""Run one function on N local ranks over gloo: rank 0 in this process, ranks 1.. spawned.

``run_group(n, fn, *args)`` calls ``fn(group, *args)`` on every rank with its ``Group`` (a
torch.distributed process group over 127.0.0.1 on a free port) and returns rank 0's result.
Each rank gets its share of the CPU threads. The spawned ranks are joined, or terminated
when rank 0 fails; a rank that dies makes the others' collectives fail within ``timeout``.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .collectives import Group
from .config import ParallelConfig

JOIN_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(config: ParallelConfig, port: int, timeout: float) -> Group:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=config.rank,
        world_size=config.world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    return Group(config, dist.group.WORLD)


def _rank(config: ParallelConfig, port: int, timeout: float, fn: Callable[..., Any], args: tuple) -> Any:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.world_size))
    group = _join(config, port, timeout)
    try:
        return fn(group, *args)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world_size: int, port: int, timeout: float, fn: Callable[..., Any], args: tuple) -> None:
    _rank(ParallelConfig(world_size, rank + 1), port, timeout, fn, args)


def run_group(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """``fn(group, *args)`` on ``world_size`` ranks (``fn`` and ``args`` picklable); rank 0's result."""
    if world_size == 1:
        return fn(Group(), *args)
    port, threads = free_port(), torch.get_num_threads()
    context = mp.start_processes(
        _spawned, (world_size, port, timeout, fn, args), nprocs=world_size - 1, join=False, start_method="spawn"
    )
    try:
        result = _rank(ParallelConfig(world_size, 0), port, timeout, fn, args)
        deadline = time.monotonic() + JOIN_SECONDS
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):  # one exit per call
            if time.monotonic() >= deadline:
                raise RuntimeError(f"ranks 1..{world_size - 1} did not exit within {JOIN_SECONDS:.0f} s")
        return result
    finally:
        torch.set_num_threads(threads)
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            process.join()
