"""Shared-memory segment names in ``/dev/shm`` (no torch here: the supervisor reads them too).

A KV pool segment (kv/shared.py) is ``dz-kv-<pid>-<id>``: the creating process, for the sweep of a
dead worker's at the next start and for the supervisor that saw it die (``unlink_pools_by``).

A parked tensor (image embeddings waiting for prefill) is
``dz-parked-<deadline ms>-<pid>-<id>.<key>.<attempt>``: the deadline for the sweep of those no reader
took, the creating process for a supervisor that stops a whole stack with its Redis (its queued
requests, and their readers, go with it), the request and run it was parked for, for its re-run."""

from __future__ import annotations

import glob
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PARKED = "dz-parked"
POOL = "dz-kv"


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
    """Unlink the parked tensors these processes created (their stack stopped: nobody reads them);
    a pid a live process holds again is skipped (``unlink_pools_by``)."""
    return _unlink_matching([f"{PARKED}-*-{pid}-*" for pid in set(pids) if gone(pid)], folder)


def unlink_pools_by(pids: Iterable[int], folder: Path = SHM_DIR) -> list[str]:
    """Unlink the KV pool segments these processes created, once they are gone: a worker SIGKILLed
    (its multiprocessing resource tracker, which would unlink them, killed with its process group)
    left its pool (256 MB by default) until the next worker start on the host swept it. A decode
    worker attached to it keeps its mapping (as after that sweep). A pid a live process holds again
    (used again since its exit) is skipped: that process's segment is in use."""
    return _unlink_matching([f"{POOL}-{pid}-*" for pid in set(pids) if gone(pid)], folder)


def room(folder: Path = SHM_DIR) -> tuple[int, int]:
    """The bytes a new segment in ``folder``'s filesystem may take now, and its whole size (a tmpfs:
    the host's memory, its size a share of it: half by default, docker's 64 MiB)."""
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def sweep(prefix: str, expired: Callable[[int], bool], folder: Path = SHM_DIR) -> list[str]:
    """Unlink the segments ``{prefix}-{number}-...`` whose number ``expired`` says is past."""
    removed = []
    for path in folder.glob(f"{prefix}-*"):
        try:
            number = int(path.name.removeprefix(f"{prefix}-").split("-")[0])
        except ValueError:
            continue
        if expired(number):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def sweep_stale(folder: Path = SHM_DIR) -> list[str]:
    """Unlink pool segments whose creating process is gone (a worker killed before it could).

    A decode worker already attached keeps its mapping; one not yet attached fails its
    handoff, and the request is re-run from its prompt by the reaper.
    """
    return sweep(POOL, gone, folder)


def unlink_own(folder: Path = SHM_DIR) -> list[str]:
    """Unlink the pool segments this process created: it ends before its runtime could close them
    (SIGTERM while it starts). Safe in a signal handler: a segment being created is found by name."""
    return sweep(POOL, os.getpid().__eq__, folder)


def gone(pid: int) -> bool:
    """Whether no live process has this pid: none (exited and reaped), or its exited process not
    reaped yet (a zombie: its parent, or an init that reaps nothing, has not waited for it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, or a zombie, of another user
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False  # (no /proc: not Linux)


def _unlink_matching(patterns: Iterable[str], folder: Path) -> list[str]:
    removed = []
    for pattern in patterns:
        for path in folder.glob(pattern):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
