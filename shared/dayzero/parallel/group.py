"""Run one function on every rank of a group: N local ranks over gloo, or this process as one rank
of a group started elsewhere (torchrun on each host, ``dayzero.parallel.launch``).

``run_group(n, fn, *args)`` calls ``fn(group, *args)`` on every rank with its ``Group`` and returns
rank 0's result. Local ranks: rank 0 in this process, ranks 1.. spawned, a torch.distributed
process group over 127.0.0.1 on a free port, each rank its share of the CPU threads (of those its
cgroup's CPU quota allows: ``usable_cpus``); the spawned ranks are joined (each ends as soon as its
work returns), or terminated when rank 0 fails, and die with rank 0 (SIGKILLed, the OOM killer's). The
meeting begins once every spawned rank has started (up to ``START_SECONDS``; one that dies
starting fails it at once): ``timeout`` bounds the meeting and the collectives, not the ranks'
start (spawn, imports), which a loaded host slows past any bound kept short to notice a silent
rank. ``launch=``: this process joins as the rank the launch names (the rendezvous store at
MASTER_ADDR:MASTER_PORT) and gets its own rank's result.
Either way, a rank that dies makes the others' collectives fail (at once when its sockets close,
within ``timeout`` when its host stops answering), and ranks that do not all meet within
``timeout`` fail the rendezvous.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..cgroups import usable_cpus
from ..procs import die_with, end_process, free_port
from .collectives import Group
from .config import ParallelConfig
from .launch import Launch, store_gone
from .meeting import MeetingFailed, RankSilent, join_meeting

JOIN_SECONDS = 60.0
START_SECONDS = 600.0  # a local rank not at the rendezvous this long after its spawn is stuck
START_POLL_S = 0.1
STORE_POLL_S = 0.25  # a joining rank's tries to reach the rendezvous store, until the group timeout
FORM_S = 15.0  # every rank was ready at the meeting: gloo's exchange of addresses takes well under 1 s
# (NCCL's forming keeps what is left of the start: its communicators' set-up grows with the GPUs)


class RendezvousFailed(TimeoutError):
    """The group's ranks did not all meet within the timeout (a rank not started, another
    MASTER_ADDR / MASTER_PORT, a host that cannot reach rank 0's)."""


class MasterPortInUse(OSError):
    """Rank 0 cannot serve the rendezvous store: another process holds MASTER_PORT on its host."""


def _rank(
    launch: Launch,
    timeout: float,
    deadline: float,
    fn: Callable[..., Any],
    args: tuple,
    before_teardown: Callable[[], None] = lambda: None,
) -> Any:
    """``deadline`` (time.monotonic()) ends the whole start: the store's connection, the meeting and
    the process group's forming each get what is left of it, not ``timeout`` each (a rank != 0 waited
    up to three timeouts); gloo's forming, once every rank is ready, ``FORM_S`` at most (a rank that
    died in between was waited for until the deadline). ``timeout`` stays the collectives' bound."""
    if launch.cuda:
        torch.cuda.set_device(launch.device)
    try:
        store = _store(launch, deadline)  # every rank came to this start's meeting and is ready
    except RankSilent as exc:  # seen before the timeout: not a timeout to blame
        raise RendezvousFailed(
            f"rank {launch.config.rank} of {launch.config.world_size}: the group did not meet at {_where(launch)} "
            f"({exc}); this start of the group fails (torchrun --max-restarts starts it again)"
        ) from None
    except (dist.DistError, MeetingFailed) as exc:  # a timeout, rank 0's address unreachable, its port taken
        raise _unmet(launch, timeout, exc) from None
    form = _left(deadline) if launch.cuda else min(_left(deadline), datetime.timedelta(seconds=FORM_S))
    try:
        dist.init_process_group(
            launch.backend,
            store=store,
            rank=launch.config.rank,
            world_size=launch.config.world_size,
            timeout=form,
            device_id=launch.device if launch.cuda else None,
        )
    except dist.DistError as exc:
        raise RendezvousFailed(
            f"rank {launch.config.rank} of {launch.config.world_size}: every rank was ready at {_where(launch)}, "
            f"then the group did not form within {form.total_seconds():.0f} s ({_first_line(exc)}): a rank died "
            "or hung as it formed; this start of the group fails (torchrun --max-restarts starts it again)"
        ) from None
    dist.group.WORLD.set_timeout(datetime.timedelta(seconds=timeout))  # the collectives' own bound
    diagnose = (lambda: store_gone(store, _where(launch))) if launch.agent_store else (lambda: None)
    try:
        result = fn(Group(launch.config, dist.group.WORLD, launch.device, diagnose), *args)
        before_teardown()
        return result
    finally:
        dist.destroy_process_group()


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _unmet(launch: Launch, timeout: float, exc: Exception) -> OSError:
    reason = _first_line(exc)
    if "EADDRINUSE" in reason:  # rank 0 serves the rendezvous store there, at once: no timeout to blame
        return MasterPortInUse(
            f"rank 0 of {launch.config.world_size} cannot serve the group's rendezvous at {_where(launch)}: "
            f"another process holds that port on this host; choose another MASTER_PORT (torchrun: --master-port)"
        )
    return _not_met(launch, timeout, reason)


def _left(deadline: float) -> datetime.timedelta:
    """What is left until ``deadline``: at least a moment, so that a step at the deadline fails as a timeout."""
    return datetime.timedelta(seconds=max(STORE_POLL_S, deadline - time.monotonic()))


def _store(launch: Launch, deadline: float) -> dist.Store:
    """The group's rendezvous store at MASTER_ADDR:MASTER_PORT, served by rank 0 (local ranks, ranks
    started by hand) or by torchrun's agent on rank 0's host, under the name of this start's meeting
    (``dayzero.parallel.meeting``): torchrun's agent keeps one store across ``--max-restarts``
    restarts and env:// prefixes nothing, so a rank restarted before rank 0 read the dead rank 0's
    gloo address and failed: the group never came back."""
    store = dist.TCPStore(
        launch.master_addr,
        launch.master_port,
        launch.config.world_size,
        is_master=launch.config.rank == 0 and not launch.agent_store,
        timeout=_left(deadline),
        multi_tenant=True,  # as env:// and tcp://: other stores of this process may share the server
    )
    return join_meeting(store, launch.config.rank, launch.config.world_size, deadline)


def _where(launch: Launch) -> str:
    return f"{launch.master_addr}:{launch.master_port}"


def _not_met(launch: Launch, timeout: float, reason: str) -> RendezvousFailed:
    return RendezvousFailed(
        f"rank {launch.config.rank} of {launch.config.world_size}: the group did not meet at {_where(launch)} "
        f"within {timeout:g} s ({reason}); are the other ranks started with the same MASTER_ADDR and MASTER_PORT?"
    )


def _await_store(launch: Launch, timeout: float, deadline: float) -> None:
    """Until the rendezvous store at MASTER_ADDR:MASTER_PORT (rank 0's, or its host's torchrun agent's)
    accepts a connection, tried here in Python: torch's own connect to a store that never comes logs
    each failed try with ~40 lines of C++ frames (TCPStore.cpp, at WARNING and ERROR: the level that
    shows gloo's and NCCL's warnings later) before it raises. By ``deadline`` (the start's, ``timeout``
    after it began), or RendezvousFailed."""
    address = (launch.master_addr, launch.master_port)
    while True:
        try:
            with socket.create_connection(address, timeout=max(STORE_POLL_S, deadline - time.monotonic())):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise _not_met(launch, timeout, f"no rendezvous store answered: {exc.strerror or exc}") from None
        time.sleep(max(0.0, min(STORE_POLL_S, deadline - time.monotonic())))


def _local(
    world_size: int,
    rank: int,
    port: int,
    timeout: float,
    cuda: bool,
    fn: Callable[..., Any],
    args: tuple,
    **teardown: Any,
) -> Any:
    torch.set_num_threads(max(1, usable_cpus() // world_size))
    launch = Launch(ParallelConfig(world_size, rank), rank, cuda, "127.0.0.1", port)
    return _rank(launch, timeout, time.monotonic() + timeout, fn, args, **teardown)


def _spawned(
    index: int,
    rank0: int,
    started,
    ports,
    world_size: int,
    timeout: float,
    cuda: bool,
    fn: Callable[..., Any],
    args: tuple,
):
    """Rank ``index + 1``: imported and unpickled, it dies with rank 0 (pid ``rank0``, its parent; one
    gone already, while this rank started: it exits at once), says it started, and meets the others at
    the port rank 0 picks once every rank has."""
    die_with(rank0)
    started.put(index)
    try:
        port = ports.get(timeout=START_SECONDS)
    except queue.Empty:
        raise RendezvousFailed(f"rank {index + 1}: rank 0 named no port within {START_SECONDS:.0f} s") from None
    _local(world_size, index + 1, port, timeout, cuda, fn, args)
    end_process()  # rank 0 waits for this exit (join_ranks): not for the interpreter's teardown too


def _await_start(context: mp.ProcessContext, started, ranks: int) -> None:
    """Until ``ranks`` spawned ranks have ``started``; a rank that died starting raises here (its
    error), ranks still starting after ``START_SECONDS`` too."""
    deadline = time.monotonic() + START_SECONDS
    for _ in range(ranks):
        while True:
            try:
                started.get(timeout=START_POLL_S)
                break
            except queue.Empty:
                context.join(timeout=0)  # raises when a rank has failed
                if time.monotonic() >= deadline:
                    raise RendezvousFailed(f"ranks 1..{ranks} did not start within {START_SECONDS:.0f} s") from None


def run_group(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 120.0,
    launch: Launch | None = None,
    device: str = "cpu",
) -> Any:
    """``fn(group, *args)`` on ``world_size`` ranks (``fn`` and ``args`` picklable); rank 0's result,
    or with ``launch`` this rank's (``launch`` refused unless its WORLD_SIZE is ``world_size``).
    ``device``: a single rank computes on it; "cuda": local ranks run NCCL, rank r on cuda:r (else
    gloo on the CPU)."""
    if launch is not None:
        launch.check(world_size)
        deadline = time.monotonic() + timeout
        if launch.config.rank:  # rank 0 serves the store itself when started by hand: nothing to wait for
            _await_store(launch, timeout, deadline)
        return _rank(launch, timeout, deadline, fn, args)
    if world_size == 1:
        return fn(Group(device=device), *args)
    threads, cuda, spawn = torch.get_num_threads(), device.startswith("cuda"), mp.get_context("spawn")
    started, ports = spawn.Queue(), spawn.Queue()
    context = mp.start_processes(
        _spawned,
        (os.getpid(), started, ports, world_size, timeout, cuda, fn, args),
        nprocs=world_size - 1,
        join=False,
        start_method="spawn",
    )

    def join_ranks() -> None:
        """Rank 0 hosts the rendezvous store: the other ranks finish their teardown before it goes
        (a store closed under a rank still tearing down aborted that rank now and then)."""
        deadline = time.monotonic() + JOIN_SECONDS
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):  # one exit per call
            if time.monotonic() >= deadline:
                raise RuntimeError(f"ranks 1..{world_size - 1} did not exit within {JOIN_SECONDS:.0f} s")

    try:
        _await_start(context, started, world_size - 1)
        port = free_port()  # picked now: a port picked before the ranks' start could be taken meanwhile
        for _ in range(world_size - 1):
            ports.put(port)
        return _local(world_size, 0, port, timeout, cuda, fn, args, before_teardown=join_ranks)
    finally:
        torch.set_num_threads(threads)
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            process.join()
