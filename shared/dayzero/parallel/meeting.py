"""Which meeting of a long-lived rendezvous store a starting rank joins, and the meeting itself:
every rank there, alive, before the process group forms.

torchrun's agent on rank 0's host serves one store for every restart of the group, so the ranks of
a new start must not meet what a dead one left there (its rank 0's gloo address). Each start of
rank 0 opens the next meeting (a counter in the store itself); every other rank joins the newest
meeting it has not joined before, or waits for rank 0 to open one. A rank's own host's count of
restarts (TORCHELASTIC_RESTART_COUNT) is not used: a host whose torchrun started again alone (a
reboot, a restarted pod) counts from 0 while the others count on, and its ranks met theirs never.

A rank restarted before its rank 0 finds the newest meeting joined already (by its dead self) and
waits for the next; a rank that comes back after rank 0 started again (its host rebooted) joins rank
0's meeting at once. A store of one start only (local ranks, ranks started by hand) holds one meeting.

In the meeting each rank beats (a count of its own in the store, up by one each ``POLL_S``) until
every rank has arrived and said it saw them all (``ready``); only then do the ranks form the process
group. A rank that arrived and fell silent before it was ready (killed, crashed, hung) is seen by the
others within ``SILENT_S``: the group's start fails then, not after the group timeout (gloo waited
the whole timeout for a silent rank's address, and a rank that came to a dead rank 0's meeting
retried its connection for several timeouts: 104 s at a 20 s timeout); the watcher must have
beaten all along too (``SILENT_BEATS``), or ranks stalled together blame each other when they go on.
Everything here ends at the caller's ``deadline`` (time.monotonic()), the same one as its other
steps of the start.
"""

from __future__ import annotations

import time

import torch.distributed as dist

MEETINGS = "dayzero/meetings"  # how many meetings rank 0 has opened in this store
POLL_S = 0.1  # a waiting rank beats and looks at the others this often
SILENT_S = 5.0  # a rank in the meeting, not ready, whose beat has not moved this long died or hung
SILENT_BEATS = round(SILENT_S / POLL_S)  # ... while the rank watching it beat this often (not stalled itself)


class MeetingFailed(TimeoutError):
    """This start of the group cannot meet: the reason says what was missing."""


class NoMeetingOpened(MeetingFailed):
    """No rank 0 opened a meeting this rank had not joined before, by the deadline."""


class RanksMissing(MeetingFailed):
    """Ranks that did not come to the meeting (or not get ready there) by the deadline."""


class RankSilent(MeetingFailed):
    """A rank came to the meeting and then gave no sign for ``SILENT_S``: it died or hung."""


def _opened(meeting: int) -> str:
    return f"dayzero/meeting{meeting}/opened"


def _joined(meeting: int, rank: int) -> str:
    return f"dayzero/meeting{meeting}/rank{rank}"


def _beat(meeting: int, rank: int) -> str:
    return f"dayzero/meeting{meeting}/beat{rank}"


def _ready(meeting: int, rank: int) -> str:
    return f"dayzero/meeting{meeting}/ready{rank}"


def join_meeting(store: dist.Store, rank: int, world_size: int, deadline: float) -> dist.PrefixStore:
    """The store under this start's meeting's name, once every rank is there: rank 0 opens the next
    meeting; another rank joins the newest meeting not joined before by its rank, waiting for rank 0
    to open it. MeetingFailed when the meeting cannot be complete by ``deadline`` (time.monotonic())."""
    if rank == 0:
        meeting = store.add(MEETINGS, 1)
        store.set(_opened(meeting), b"")
    else:
        meeting = _newest_unjoined(store, rank, deadline)
    _meet(store, meeting, rank, world_size, deadline)
    return dist.PrefixStore(f"dayzero/meeting{meeting}/group", store)


def _newest_unjoined(store: dist.Store, rank: int, deadline: float) -> int:
    """Polled (``check``, no wait in the store): a store's wait that times out logs C++ warnings."""
    while True:
        meeting = store.add(MEETINGS, 0)
        if meeting and store.add(_joined(meeting, rank), 1) == 1:  # the first of this rank here: this start
            return meeting
        while not store.check([_opened(meeting + 1)]):
            if time.monotonic() >= deadline:
                joined = f"meeting {meeting} joined by rank {rank} already" if meeting else "none opened"
                raise NoMeetingOpened(f"rank 0 started no new meeting of the group ({joined})")
            time.sleep(POLL_S)


def _meet(store: dist.Store, meeting: int, rank: int, world_size: int, deadline: float) -> None:
    """Beat until every rank has arrived and is ready (has seen every rank arrive). Only ranks not
    ready are watched for silence: a ready rank stops beating once it sees all ready, and all are
    then (the marks stay), so no rank waits on one that left. A rank is silent when its beat has not
    moved for SILENT_S while this rank beat SILENT_BEATS times: ranks stalled together (a frozen or
    starved host, the store's server stalled) do not take each other for silent when they go on."""
    beats = [_beat(meeting, r) for r in range(world_size)]
    readies = [_ready(meeting, r) for r in range(world_size)]
    moved: dict[int, tuple[int, float, int]] = {}  # rank: (its beat count, when and at which beat of ours it changed)
    while True:
        counts = [store.add(beat, 1 if r == rank else 0) for r, beat in enumerate(beats)]  # 0: not arrived
        if all(counts) and not store.check([readies[rank]]):
            store.set(readies[rank], b"")
        if store.check(readies):
            return
        now, unready = time.monotonic(), [r for r in range(world_size) if not store.check([readies[r]])]
        for r in unready:
            count, since, ours = moved.get(r, (None, now, counts[rank]))
            if count != counts[r]:
                moved[r] = (counts[r], now, counts[rank])
            elif counts[r] and now - since >= SILENT_S and counts[rank] - ours >= SILENT_BEATS:
                raise RankSilent(
                    f"rank {r} came to meeting {meeting} and then gave no sign for {now - since:.0f} s: "
                    "it died or hung before the group formed"
                )
        if now >= deadline:
            missing = ", ".join(str(r) for r in unready)
            raise RanksMissing(f"ranks not at meeting {meeting}, or not ready there: {missing}")
        time.sleep(POLL_S)
