"""Tensor + expert parallelism (TP == EP) over torch.distributed, applied at load time.

``ParallelConfig`` says how many ranks and which one; ``shard`` says which slice of each
tensor a rank owns; ``Group`` is the one place the forward talks to the other ranks (a
no-op for one rank); ``run_group`` runs a function on N local ranks over gloo, or on this
process as one rank of a group torchrun started on several hosts (``launch.launch_from``).
"""

from .collectives import Group
from .config import ParallelConfig, ParallelError, check_divisible

__all__ = ["Group", "ParallelConfig", "ParallelError", "check_divisible"]
