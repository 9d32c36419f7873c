"""A checkpoint's headers checked before any data is read: every tensor the model needs present,
of its shape and dtype; each stored once; each FP8 block-scale tensor beside a float8_e4m3fn
weight, with that weight's whole scale grid.

The last three would otherwise load wrong numbers without an error: a second copy (another
shard, another spelling, ``.scale`` beside ``.weight_scale_inv``) overwrites the first in file
order; a scale beside a bf16 or e5m2 weight is ignored; and a rank of a split model slices the
scale grid it finds, so a grid short of a block row or column is misapplied where one rank would
refuse it.
"""

from __future__ import annotations

import torch

from .checkpoint_files import CheckpointError, Entry, Placed
from .quant.formats import fp8_grid

INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.int64)
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32)

Key = tuple[str, int | None]  # the model tensor and expert slot a stored tensor fills


def _expected_dtype(p: Placed, e: Entry, target: torch.Tensor) -> str | None:
    """What the tensor's dtype should be, when it is not that."""
    dtype = getattr(torch, e.dtype_name, None)
    if p.role != "tensor":
        return None if dtype in SCALE_DTYPES else "float8_e8m0fnu, uint8 or float32 scales"
    if target.dtype in (torch.int8, torch.uint8) and p.expert is not None:
        return None if dtype in (torch.int8, torch.uint8) else "int8 (two E2M1 values per byte: FP4 experts)"
    if target.dtype in INTEGER_DTYPES:
        return None if dtype in INTEGER_DTYPES else "an integer dtype"
    return None if dtype is not None and dtype.is_floating_point else "a floating-point dtype"


def check_headers(
    placed: list[tuple[Entry, Placed]], expected: dict[str, torch.Tensor], block: tuple[int, int]
) -> None:
    """One CheckpointError naming the first problem (and how many more) of ``placed``, the stored
    tensors, against ``expected``, the model's tensors."""
    problems: list[str] = []
    seen: dict[str, set[int | None]] = {}
    scaled = {(p.target, p.expert) for _, p in placed if p.role == "block_scale"}
    for e, p in placed:
        want = expected[p.target]
        shape = tuple(want.shape[1:]) if p.expert is not None else tuple(want.shape)
        wrong_dtype = _expected_dtype(p, e, want)
        if p.expert is not None and not 0 <= p.expert < want.shape[0]:
            problems.append(f"tensor {e.key!r}: expert index {p.expert} out of range [0, {want.shape[0]})")
        elif p.role != "block_scale" and e.shape != shape:
            problems.append(f"tensor {e.key!r} has shape {list(e.shape)}, expected {list(shape)}")
        elif wrong_dtype:
            problems.append(f"tensor {e.key!r} is {e.dtype_name}, expected {wrong_dtype}")
        elif e.dtype_name == "float8_e4m3fn" and (p.target, p.expert) not in scaled:
            problems.append(f"tensor {e.key!r} is FP8 but the checkpoint has no scales for it")
        if p.role != "block_scale":
            seen.setdefault(p.target, set()).add(p.expert)
    for name, t in expected.items():
        got = seen.get(name, set())
        if ".ffn.experts." in name:
            absent = sorted(set(range(t.shape[0])) - got)
            if absent:
                stem, matrix = name.rsplit(".", 1)
                stored = f"{matrix.removesuffix('_scale')}.scale" if matrix.endswith("_scale") else f"{matrix}.weight"
                problems.append(f"missing tensor {stem}.{absent[0]}.{stored}")
        elif not got:
            problems.append(f"missing tensor {name!r}")
    problems += _pairing_problems(placed, block)  # after each tensor's own dtype and shape
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise CheckpointError(problems[0] + more)


def _pairing_problems(placed: list[tuple[Entry, Placed]], block: tuple[int, int]) -> list[str]:
    """One line per problem, each naming the stored tensors (and files) at fault."""
    return _stored_twice(placed) + _misplaced_scales(placed, block)


def _stored_twice(placed: list[tuple[Entry, Placed]]) -> list[str]:
    first: dict[tuple[str, int | None, str], Entry] = {}
    problems = []
    for e, p in placed:
        if (other := first.setdefault((p.target, p.expert, p.role), e)) is not e:
            problems.append(
                f"tensor {e.key!r} in {e.file.name} is stored twice: also as {other.key!r} in {other.file.name}"
            )
    return problems


def _misplaced_scales(placed: list[tuple[Entry, Placed]], block: tuple[int, int]) -> list[str]:
    weights: dict[Key, Entry] = {(p.target, p.expert): e for e, p in placed if p.role == "tensor"}
    problems = []
    for e, p in placed:
        w = weights.get((p.target, p.expert))
        if p.role != "block_scale" or w is None:
            continue  # (a scale without its weight: the weight is reported missing)
        if w.dtype_name != "float8_e4m3fn":
            problems.append(f"tensor {e.key!r} scales {w.key!r}, which is {w.dtype_name}, not FP8 (float8_e4m3fn)")
        elif len(w.shape) == 2 and e.shape != (grid := fp8_grid(*w.shape, block)):
            problems.append(
                f"tensor {e.key!r} has shape {list(e.shape)}: the {block[0]}x{block[1]} block scales of "
                f"{w.key!r} {list(w.shape)} are {list(grid)}"
            )
    return problems
