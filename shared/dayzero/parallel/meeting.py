"""Which meeting of a long-lived rendezvous store a starting rank joins: the group's name there.

torchrun's agent on rank 0's host serves one store for every restart of the group, so the ranks of
a new start must not meet what a dead one left there (its rank 0's gloo address). Each start of
rank 0 opens the next meeting (a counter in the store itself); every other rank joins the newest
meeting it has not joined before, or waits for rank 0 to open one. A rank's own host's count of
restarts (TORCHELASTIC_RESTART_COUNT) is not used: a host whose torchrun started again alone (a
reboot, a restarted pod) counts from 0 while the others count on, and its ranks met theirs never.

A rank restarted before its rank 0 finds the newest meeting joined already (by its dead self) and
waits for the next; a rank that comes back after rank 0 started again (its host rebooted) joins rank
0's meeting at once. A store of one start only (local ranks, ranks started by hand) holds one meeting.
"""

from __future__ import annotations

import time

import torch.distributed as dist

MEETINGS = "dayzero/meetings"  # how many meetings rank 0 has opened in this store
POLL_S = 0.1  # a waiting rank looks for a newly opened meeting this often


class NoMeetingOpened(TimeoutError):
    """No rank 0 opened a meeting this rank had not joined before, within the group timeout."""


def _opened(meeting: int) -> str:
    return f"dayzero/meeting{meeting}/opened"


def _joined(meeting: int, rank: int) -> str:
    return f"dayzero/meeting{meeting}/rank{rank}"


def join_meeting(store: dist.Store, rank: int, timeout: float) -> dist.PrefixStore:
    """The store under this start's meeting's name: rank 0 opens the next meeting; another rank joins
    the newest meeting not joined before by its rank, waiting up to ``timeout`` for rank 0 to open it."""
    if rank == 0:
        meeting = store.add(MEETINGS, 1)
        store.set(_opened(meeting), b"")
    else:
        meeting = _newest_unjoined(store, rank, timeout)
    return dist.PrefixStore(f"dayzero/meeting{meeting}/group", store)


def _newest_unjoined(store: dist.Store, rank: int, timeout: float) -> int:
    """Polled (``check``, no wait in the store): a store's wait that times out logs C++ warnings."""
    deadline = time.monotonic() + timeout
    while True:
        meeting = store.add(MEETINGS, 0)
        if meeting and store.add(_joined(meeting, rank), 1) == 1:  # the first of this rank here: this start
            return meeting
        while not store.check([_opened(meeting + 1)]):
            if time.monotonic() >= deadline:
                joined = f"meeting {meeting} joined by rank {rank} already" if meeting else "none opened"
                raise NoMeetingOpened(f"rank 0 started no new meeting of the group within {timeout:g} s ({joined})")
            time.sleep(POLL_S)
