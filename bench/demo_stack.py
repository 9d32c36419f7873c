"""The stack the benchmarks run on: the demo checkpoint written into a folder and a Stack of workers on
it, its settings (DAYZERO_* and the like) in its environment, started, ready, and stopped after (also
when it never came ready)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port
from dayzero.stack import Stack

READY_S = 300  # how long a bench waits for its stack's /ready
# Faults found within a second or two (a lease of 1 s, a keepalive each second), 2,500-token prompts let in
QUICK_LEASES = {"DAYZERO_LEASE_S": "1.0", "DAYZERO_MAX_CONTEXT": "4096", "DAYZERO_KEEPALIVE_S": "1.0"}


@contextmanager
def scratch(keep: str = "") -> Iterator[Path]:
    """A bench's folder: ``keep`` where one is named (left after), else a temporary one (removed after)."""
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(keep or tmp)


def stack_on(
    checkpoint: Path,
    workers: dict[str, int],
    logs: Path,
    settings: dict[str, str] | None = None,
    redis_url: str | None = None,
) -> Stack:
    """A stack, not started, of ``workers`` per stage on ``checkpoint`` (its gateway on a free port, its
    logs in ``logs``), with ``settings`` in its environment, on ``redis_url`` (else a Redis of its own)."""
    env = {"DAYZERO_CHECKPOINT": str(checkpoint), **(settings or {})}
    return Stack(workers, free_port(), logs, env, redis_url=redis_url)


@contextmanager
def running(stack: Stack, ready_s: float | None = READY_S) -> Iterator[Stack]:
    """``stack`` started and ready (``/ready`` within ``ready_s``); stopped after, also when it never was."""
    stack.start()
    try:
        stack.wait_ready(timeout_s=ready_s)
        yield stack
    finally:
        stack.stop()


@contextmanager
def demo_stack(
    folder: Path,
    workers: dict[str, int],
    settings: dict[str, str] | None = None,
    fp4: bool = False,
    vision: bool = False,
    ready_s: float | None = READY_S,
    redis_url: str | None = None,
) -> Iterator[Stack]:
    """In ``folder``: the demo checkpoint (``demo/``; ``fp4``: the release's formats, ``vision``: with
    its vision tower) and a running stack of ``workers`` on it (logs in ``logs/``; on ``redis_url``,
    else a Redis of its own)."""
    checkpoint = write_demo_checkpoint(folder / "demo", vision=vision, fp4=fp4)
    with running(stack_on(checkpoint, workers, folder / "logs", settings, redis_url), ready_s) as stack:
        yield stack
