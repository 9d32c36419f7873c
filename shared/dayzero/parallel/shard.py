"""Which slice of each tensor a rank owns, and the module tree cut down to those slices.

Split as DeepSeek's reference splits (FACTS, "Tensor parallel in DeepSeek's reference"):
query heads (``wq_b`` rows, ``attn_sink``), output groups (``wo_a`` rows), ``wo_b`` by its
input columns, indexer heads (``indexer.wq_b`` rows, ``weights_proj`` rows), the shared
expert by its hidden rows (``w1``/``w3`` rows, ``w2`` columns), embedding and head by
vocabulary rows; routed experts by index range. Everything else (``wq_a``, the single KV head
``wkv``, compressors, norms, gates, hyper-connections) is replicated.

FP8 weights are sliced in packed form with their 128x128 block scales, so a rank's slice
must be a whole number of blocks along the split dimension (refused before reading
otherwise). Packed FP4 experts are never split along their 32-column blocks: a rank reads
whole experts.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .config import ParallelConfig, ParallelError

ROWS, COLUMNS = 0, 1
_SPLITS = (
    (re.compile(r"\.attn\.(wq_b|wo_a)\.weight$"), ROWS),
    (re.compile(r"\.attn\.attn_sink$"), ROWS),
    (re.compile(r"\.attn\.wo_b\.weight$"), COLUMNS),
    (re.compile(r"\.attn\.indexer\.(wq_b|weights_proj)\.weight$"), ROWS),
    (re.compile(r"\.ffn\.shared_experts\.(w1|w3)\.weight$"), ROWS),
    (re.compile(r"\.ffn\.shared_experts\.w2\.weight$"), COLUMNS),
    (re.compile(r"^(embed|head)\.weight$"), ROWS),
    (re.compile(r"\.ffn\.experts\.w[123](_scale)?$"), ROWS),  # stacked [E, ...]: by expert index
)


def split_dim(name: str) -> int | None:
    """The dimension of model tensor ``name`` split over the ranks (None: replicated)."""
    return next((dim for pattern, dim in _SPLITS if pattern.search(name)), None)


def is_experts(name: str) -> bool:
    return ".ffn.experts." in name


def owns_expert(parallel: ParallelConfig, n_experts: int, expert: int) -> bool:
    start, stop = parallel.span(n_experts)
    return start <= expert < stop


def local_index(name: str, shape: tuple[int, ...], parallel: ParallelConfig, block: int = 1) -> tuple[slice, ...]:
    """The index of this rank's part of a stored tensor of full ``shape`` (``block``: the rows or
    columns one stored element covers, 128 for the scales of an FP8 weight)."""
    dim = split_dim(name)
    if dim is None or parallel.world_size == 1:
        return ()
    start, stop = parallel.span(shape[dim] * block)
    cut = slice(start // block, -(-stop // block))
    return (slice(None),) * dim + (cut,)


def check_blocks(name: str, shape: tuple[int, ...], parallel: ParallelConfig, block: tuple[int, int]) -> None:
    """An FP8 weight's slice must be whole blocks of its scale grid along the split dimension."""
    dim = split_dim(name)
    if dim is None or parallel.world_size == 1:
        return
    local = shape[dim] // parallel.world_size
    if local % block[dim]:
        what = "rows" if dim == ROWS else "columns"
        raise ParallelError(
            f"{name}: {shape[dim]} {what} over {parallel.world_size} ranks is {local} per rank, "
            f"not a whole number of {block[dim]}-{what[:-1]} FP8 blocks"
        )


def shard_skeleton(model: nn.Module, parallel: ParallelConfig) -> None:
    """Cut every split tensor of a meta-device module tree to this rank's local shape, in place."""
    if parallel.world_size == 1:
        return
    for name, tensor in list(model.state_dict(keep_vars=True).items()):
        dim = split_dim(name)
        if dim is None:
            continue
        shape = list(tensor.shape)
        shape[dim] = parallel.part(shape[dim])
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        local = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
        if isinstance(tensor, nn.Parameter):
            setattr(owner, attr, nn.Parameter(local, requires_grad=False))
        else:
            owner.register_buffer(attr, local)
