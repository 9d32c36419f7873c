"""A group's start ends at one deadline, and a rank that came to the meeting and died is seen by the
others before it: the start fails with a line that names the silent rank, not after the timeout.

Real gloo ranks (processes joining through ``run_group(launch=...)``, the agent's store played here
as in test_restarts); the deadline's test runs rank 1 in this process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from dayzero.parallel.config import ParallelConfig
from dayzero.parallel.group import RendezvousFailed, run_group
from dayzero.parallel.launch import Launch
from dayzero.parallel.meeting import POLL_S
from dayzero.procs import free_port

from .test_restarts import RANK_SUM, RUN_S, _agent_store, _rank, _results

TIMEOUT_S = 60  # the group timeout: far past SILENT_S and FORM_S, so a start failing first did not wait it out
SILENT_S, FORM_S = 2.0, 3.0  # the ranks' meeting.SILENT_S and group.FORM_S (5 and 15 s): the waits these tests see out
SMALL_BOUNDS = f"""
import dayzero.parallel.group as group, dayzero.parallel.meeting as meeting
meeting.SILENT_S, meeting.SILENT_BEATS, group.FORM_S = {SILENT_S}, {round(SILENT_S / POLL_S)}, {FORM_S}
"""
RANK = SMALL_BOUNDS + RANK_SUM
DIES_AS_THE_GROUP_FORMS = (
    SMALL_BOUNDS
    + """
import os
import dayzero.parallel.group as group
meet = group.join_meeting
def meet_then_die(*args, **kwargs):
    meet(*args, **kwargs)  # every rank came and is ready
    os._exit(9)  # gone before gloo's exchange of addresses
group.join_meeting = meet_then_die
"""
    + RANK_SUM
)


def _until_in_meeting(agent: dist.TCPStore, rank: int) -> None:
    """Until ``rank`` has come to meeting 1 (opened it, rank 0; joined it, another) and beaten there
    once; a start that does not beat is given 2 s after its join."""
    came = "dayzero/meeting1/opened" if rank == 0 else f"dayzero/meeting1/rank{rank}"
    deadline = time.monotonic() + RUN_S
    while not agent.check([came]) and time.monotonic() < deadline:
        time.sleep(0.02)
    deadline = min(deadline, time.monotonic() + 2.0)
    while agent.add(f"dayzero/meeting1/beat{rank}", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.slow
def test_a_rank_that_came_to_the_meeting_and_died_fails_the_others_start():
    """Ranks 0 and 1 of 3 met, rank 2 still starting, rank 1 SIGKILLed: rank 0 waited the whole group
    timeout in gloo for rank 2 (20.7 s at a 20 s timeout) and then blamed the timeout."""
    port = free_port()
    agent = _agent_store(port)
    ranks = [_rank(r, 0, port, TIMEOUT_S, world_size=3, script=RANK) for r in (0, 1)]
    try:
        _until_in_meeting(agent, 1)
        ranks[1].kill()
    finally:
        [(code, _, err), _] = _results(ranks)
    assert code == 1, err[-3000:]
    told = f"rank 0 of 3: the group did not meet at 127.0.0.1:{port} (rank 1 came to meeting 1 and then gave no sign"
    assert told in err, err[-3000:]
    assert "s: it died or hung before the group formed)" in err, err[-3000:]
    del agent


@pytest.mark.slow
def test_ranks_stalled_together_do_not_take_each_other_for_silent():
    """Ranks 0 and 1 of 3 in the meeting stall together past SILENT_S (a frozen or starved host; SIGSTOP
    here), rank 0 going on a moment before rank 1: rank 0 read rank 1's beat unmoved across its own
    stall and failed the start, naming rank 1 silent, as alive as itself. A watcher now counts silence
    in beats of its own, not in time alone; the group forms once rank 2 comes."""
    port = free_port()
    agent = _agent_store(port)
    ranks = [_rank(r, 0, port, TIMEOUT_S, world_size=3, script=RANK) for r in (0, 1)]
    try:
        for rank in (0, 1):
            _until_in_meeting(agent, rank)
        os.kill(ranks[1].pid, signal.SIGSTOP)
        beats, deadline = agent.add("dayzero/meeting1/beat0", 0), time.monotonic() + RUN_S
        while agent.add("dayzero/meeting1/beat0", 0) < beats + 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # until rank 0 has read rank 1's last beat
        os.kill(ranks[0].pid, signal.SIGSTOP)
        time.sleep(SILENT_S + 1.0)
        for process in ranks:
            os.kill(process.pid, signal.SIGCONT)
            time.sleep(0.5)  # rank 0 beats ~5 times before rank 1 goes on
        ranks.append(_rank(2, 0, port, TIMEOUT_S, world_size=3, script=RANK))
    finally:
        results = _results(ranks)
    assert [(code, out) for code, out, _ in results] == [(0, "6\n")] * 3, [err[-3000:] for _, _, err in results]
    del agent


@pytest.mark.slow
def test_a_rank_that_comes_to_a_dead_rank_0s_meeting_fails_its_start():
    """Rank 0 opened a meeting and died; rank 1, started after, joined it and retried gloo's connection
    to the dead address for several group timeouts (104 s at a 20 s timeout): its torchrun saw nothing."""
    port = free_port()
    agent = _agent_store(port)
    first = _rank(0, 0, port, TIMEOUT_S, script=RANK)
    try:
        _until_in_meeting(agent, 0)
        first.kill()
    finally:
        _results([first])
    [(code, _, err)] = _results([_rank(1, 0, port, TIMEOUT_S, script=RANK)])
    assert code == 1, err[-3000:]
    assert "(rank 0 came to meeting 1 and then gave no sign" in err, err[-3000:]
    del agent


def test_a_rank_waits_one_timeout_in_all_not_one_per_step():
    """Rank 1 (this process) with a 3 s timeout: the store comes up 1.5 s into its start, rank 0's
    meeting opens at 4 s and rank 0 never forms the group. Each step had the whole timeout: rank 1
    waited for the store (1.5 s), joined the meeting (at 4 s) and waited in gloo until 7 s for rank 0's
    address, then blamed gloo's wait. The start's deadline ends the meeting's wait at 3 s."""
    port, stores = free_port(), []
    store_up = threading.Timer(1.5, lambda: stores.append(_agent_store(port)))

    def open_meeting() -> None:  # as rank 0's start does
        stores[0].add("dayzero/meetings", 1)
        stores[0].set("dayzero/meeting1/opened", b"")

    opened = threading.Timer(4.0, open_meeting)
    launch = Launch(ParallelConfig(2, 1), master_port=port, agent_store=True)
    store_up.start()
    opened.start()
    try:
        with pytest.raises(RendezvousFailed) as failed:
            run_group(2, _backend_timeout, launch=launch, timeout=3.0)
    finally:
        store_up.join()
        opened.cancel()
        opened.join()
    assert "within 3 s (rank 0 started no new meeting of the group (none opened))" in str(failed.value)
    stores.clear()  # the store's server ends


@pytest.mark.slow
def test_a_rank_that_dies_as_the_group_forms_fails_the_others_start_before_the_timeout():
    """Every rank ready at the meeting, rank 1 gone before gloo's exchange of addresses (a window of
    milliseconds): rank 0 waited in gloo for what was left of the group timeout (30.1 s at 30 s) and
    then asked whether the ranks had the same MASTER_ADDR and MASTER_PORT."""
    port = free_port()
    agent = _agent_store(port)
    started = time.monotonic()
    ranks = [_rank(0, 0, port, TIMEOUT_S, script=RANK), _rank(1, 0, port, TIMEOUT_S, script=DIES_AS_THE_GROUP_FORMS)]
    [(code, _, err), (died, _, _)] = _results(ranks)
    took = time.monotonic() - started
    assert (code, died) == (1, 9), err[-3000:]
    told = f"rank 0 of 2: every rank was ready at 127.0.0.1:{port}, then the group did not form within {FORM_S:g} s ("
    assert told in err and "a rank died or hung as it formed" in err, err[-3000:]
    assert took < TIMEOUT_S, f"rank 0 failed {took:.1f} s after its start: the group timeout is {TIMEOUT_S} s"
    del agent


def _backend_timeout(group) -> float:
    return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def test_the_collectives_keep_the_whole_timeout():
    """The process group forms within what is left of the start's deadline; its collectives' own
    bound is still the group timeout."""
    assert run_group(2, _backend_timeout, timeout=30.0) == 30.0
