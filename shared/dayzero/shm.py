"""Shared-memory segment names in ``/dev/shm`` (no torch here: the supervisor reads them too).

A parked tensor (image embeddings waiting for prefill) is ``dz-parked-<deadline ms>-<pid>-<id>``:
the deadline for the sweep of those no reader took, the creating process for a supervisor that
stops a whole stack with its Redis (its queued requests, and their readers, go with it)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PARKED = "dz-parked"


def parked_name(ttl_s: float) -> str:
    """A new parked tensor's segment name: its deadline ``ttl_s`` from now, this process's id."""
    return f"{PARKED}-{int((time.time() + ttl_s) * 1000)}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def unlink_parked_by(pids: Iterable[int], folder: Path = SHM_DIR) -> list[str]:
    """Unlink the parked tensors these processes created (their stack stopped: nobody reads them)."""
    removed = []
    for pid in set(pids):
        for path in folder.glob(f"{PARKED}-*-{pid}-*"):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
