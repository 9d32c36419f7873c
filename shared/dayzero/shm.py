"""Shared-memory segment names in ``/dev/shm`` (no torch here: the supervisor reads them too).

A parked tensor (image embeddings waiting for prefill) is
``dz-parked-<deadline ms>-<pid>-<id>.<key>.<attempt>``: the deadline for the sweep of those no reader
took, the creating process for a supervisor that stops a whole stack with its Redis (its queued
requests, and their readers, go with it), the request and run it was parked for, for its re-run."""

from __future__ import annotations

import glob
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PARKED = "dz-parked"


def parked_name(ttl_s: float, key: str = "", attempt: int = 0) -> str:
    """A new parked tensor's segment name: its deadline ``ttl_s`` from now, this process's id, the
    request (``key``) and run it is parked for."""
    deadline = int((time.time() + ttl_s) * 1000)
    return f"{PARKED}-{deadline}-{os.getpid()}-{uuid.uuid4().hex[:12]}.{key}.{attempt}"


def unlink_parked_before(key: str, attempt: int, folder: Path = SHM_DIR) -> list[str]:
    """Unlink what request ``key``'s runs before ``attempt`` parked: nobody reads it now (a re-run
    follows a lost message: the prefill worker that took it died)."""
    removed = []
    for path in folder.glob(f"{PARKED}-*.{glob.escape(key)}.*"):
        run = path.name.rsplit(".", 1)[1]
        if run.isdigit() and int(run) < attempt:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def unlink_parked_by(pids: Iterable[int], folder: Path = SHM_DIR) -> list[str]:
    """Unlink the parked tensors these processes created (their stack stopped: nobody reads them)."""
    removed = []
    for pid in set(pids):
        for path in folder.glob(f"{PARKED}-*-{pid}-*"):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
