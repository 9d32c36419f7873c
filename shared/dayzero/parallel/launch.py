"""This process as one rank of a group whose ranks were started elsewhere: by ``torchrun`` on each
host, or by hand with the same variables.

``launch_from(environ, device)`` reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
(the caller passes the entry point's environment; nothing else here reads it) and gives ``None``
when neither RANK nor WORLD_SIZE is set: the command then starts its own local ranks. A value that
cannot work is refused at once, naming the variable: a MASTER_ADDR that does not resolve (a typo in
a host name waited out the whole group timeout), a MASTER_PORT that is not a port. From torchrun's
agent also TORCHELASTIC_USE_AGENT_STORE (it serves the store), not TORCHELASTIC_RESTART_COUNT (one
host's count; ``dayzero.parallel.meeting`` says why). The ranks meet at the rendezvous store at
MASTER_ADDR:MASTER_PORT (``dayzero.parallel.group``), gloo on CPU, NCCL with ``cuda:LOCAL_RANK``
when the device is CUDA.
"""

from __future__ import annotations

import datetime
import queue
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ParallelConfig, ParallelError
from .meeting import MEETINGS

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
RESOLVE_SECONDS = 10.0  # a resolver silent this long will not answer the rendezvous either
PROBE_S = 2.0  # a rendezvous store's server that is there answers a look-up at once


@dataclass(frozen=True, slots=True)
class Launch:
    config: ParallelConfig  # RANK of WORLD_SIZE
    local_rank: int = 0  # this rank's index on its host: its GPU
    cuda: bool = False
    master_addr: str = "127.0.0.1"  # where the ranks meet: rank 0's host (torchrun's agent there)
    master_port: int = 0
    agent_store: bool = False  # torchrun's agent serves the rendezvous store, not rank 0

    @property
    def backend(self) -> str:
        return "nccl" if self.cuda else "gloo"

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.cuda else torch.device("cpu")

    def check(self, tensor_parallel: int) -> None:
        """Refuse a group whose size is not the ``--tensor-parallel`` size asked for."""
        if self.config.world_size != tensor_parallel:
            raise ParallelError(
                f"WORLD_SIZE is {self.config.world_size} (ranks started by torchrun: --nnodes x --nproc-per-node) "
                f"but --tensor-parallel is {tensor_parallel}; they must be equal"
            )


def launch_from(environ: Mapping[str, str], device: str) -> Launch | None:
    """The rank these variables describe, or ``None`` when RANK and WORLD_SIZE are both unset.
    ``device``: the settings' device ("cpu", "cuda", "cuda:N"; a joined rank uses cuda:LOCAL_RANK)."""
    if "RANK" not in environ and "WORLD_SIZE" not in environ:
        return None
    missing = [name for name in VARIABLES if not environ.get(name)]
    if missing:
        raise ParallelError(f"joining a group needs {', '.join(VARIABLES)}; not set: {', '.join(missing)}")
    try:
        rank, world_size, local_rank, port = (int(environ[n]) for n in VARIABLES if n != "MASTER_ADDR")
    except ValueError as exc:
        raise ParallelError(f"RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers: {exc}") from None
    if not 0 < port < 1 << 16:
        raise ParallelError(f"MASTER_PORT must be a port number, 1 to 65535; got {port} (torchrun: --master-port)")
    if local_rank < 0:
        raise ParallelError(f"LOCAL_RANK must be 0 or more; got {local_rank}")
    address = environ["MASTER_ADDR"]
    check_resolves(address)
    agent, cuda = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True", device.startswith("cuda")
    return Launch(ParallelConfig(world_size, rank), local_rank, cuda, address, port, agent)


def check_resolves(host: str, bound: float = RESOLVE_SECONDS) -> None:
    """Refuse a MASTER_ADDR this host cannot resolve: torch's store would retry it until the group
    timeout and then report a timeout. The look-up runs in a thread of its own, bounded: a resolver
    that does not answer holds up the start for ``bound`` seconds at most."""
    answers: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    threading.Thread(target=lambda: answers.put(_lookup_problem(host)), daemon=True).start()
    try:
        problem = answers.get(timeout=bound)
    except queue.Empty:
        problem = f"no answer from the resolver within {bound:g} s"
    if problem is not None:
        raise ParallelError(
            f"MASTER_ADDR {host!r} does not resolve to an address ({problem}); set it to rank 0's host name "
            f"or address (torchrun: --master-addr)"
        )


def _lookup_problem(host: str) -> str | None:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror; a label over 63 characters: UnicodeError
        return getattr(exc, "strerror", None) or str(exc)
    return None


def store_gone(store: dist.PrefixStore, where: str) -> str | None:
    """After a failed collective, under torchrun's agent store: whether that store's server (the
    torchrun on rank 0's host) is gone too, and what that means. This rank's connection to it is the
    like of its own host's agent's: a torchrun started again on rank 0's host serves a new store, and
    the other hosts' agents, still connected to the gone one, fail at their next restart (static and
    c10d rendezvous alike; torchrun exits 1 with a DistNetworkError) and never meet it. Bounded: ``PROBE_S``."""
    server = store.underlying_store
    server.set_timeout(datetime.timedelta(seconds=PROBE_S))
    try:
        server.check([MEETINGS])  # any key: one round trip to the server this rank met at
    except dist.DistError:  # the connection closed (DistNetworkError), or no answer (DistStoreError)
        return (
            f"the rendezvous store at {where} does not answer either: the torchrun on rank 0's host ended, was "
            "started again or cannot be reached, and the torchrun on every other host, connected to the gone "
            "store, cannot meet a new one (it exits 1 at its restart): start every host's torchrun again (run "
            "each under a supervisor that restarts it when it exits)"
        )
    return None
