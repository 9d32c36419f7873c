"""How a checkpoint's stored tensors pair up, from the headers: each model tensor stored once, and
each FP8 block-scale tensor beside a float8_e4m3fn weight, with that weight's whole scale grid.

Each would otherwise load wrong numbers without an error: a second copy (another shard, another
spelling, ``.scale`` beside ``.weight_scale_inv``) overwrites the first in file order; a scale
beside a bf16 or e5m2 weight is ignored; and a rank of a split model slices the scale grid it
finds, so a grid short of a block row or column is misapplied where one rank would refuse it.
"""

from __future__ import annotations

from .checkpoint_files import Entry, Placed
from .quant.formats import fp8_grid

Key = tuple[str, int | None]  # the model tensor and expert slot a stored tensor fills


def pairing_problems(placed: list[tuple[Entry, Placed]], block: tuple[int, int]) -> list[str]:
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
