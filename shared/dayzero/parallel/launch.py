"""This process as one rank of a group whose ranks were started elsewhere: by ``torchrun`` on each
host, or by hand with the same variables.

``launch_from(environ, device)`` reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
(the caller passes the entry point's environment; nothing else here reads it) and gives ``None``
when neither RANK nor WORLD_SIZE is set: the command then starts its own local ranks. The ranks
meet at MASTER_ADDR:MASTER_PORT by env:// rendezvous (``dayzero.parallel.group``), gloo on CPU,
NCCL with ``cuda:LOCAL_RANK`` when the device is CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .config import ParallelConfig, ParallelError

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, slots=True)
class Launch:
    config: ParallelConfig  # RANK of WORLD_SIZE
    local_rank: int = 0  # this rank's index on its host: its GPU
    cuda: bool = False

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
        rank, world_size, local_rank, _ = (int(environ[n]) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"))
    except ValueError as exc:
        raise ParallelError(f"RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers: {exc}") from None
    return Launch(ParallelConfig(world_size, rank), local_rank, cuda=device.startswith("cuda"))
