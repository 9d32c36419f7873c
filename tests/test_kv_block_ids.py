"""A state's block ids as int64 bytes (``kv.handoff.ids_bytes``, a message's ``block_ids``): the
import copies what the lists copy, on host pools (the compiled copy) and the torch path, into a
new sequence or one held already; bytes that do not fit the state's length or pools raise a
LookupError (decode gives the request back to be re-run), as lists that do not fit do."""

from __future__ import annotations

import struct
from array import array

import numpy as np
import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kv.handoff import _plan, export_state, ids_bytes, import_state
from dayzero.kv.layout import POOL_KINDS
from dayzero.kv.pools import KVPools, pools_for

from .conftest import tiny_config


def _source() -> tuple[KVPools, KVPools]:
    """A 29-token state in blocks of 3 rows (its tables longer than 29 tokens need), and pools to
    import it into whose free blocks are scattered."""
    cfg = ModelConfig.from_dict(tiny_config())
    src = pools_for(cfg, torch.float32, 40, max_sequences=2, block_size=3)
    src.reserve("other", 20)
    src.reserve("s", 38)
    src.sequences["s"].length = 29
    for i, tensor in enumerate(src.tensors()):
        tensor.copy_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(i)))
    dst = pools_for(cfg, torch.float32, 40, max_sequences=4, block_size=3)
    for seq, length in (("a", 7), ("b", 17)):
        dst.reserve(seq, length)
    dst.release("a")
    return src, dst


def _packed(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}q", *ids)


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("on_host", [True, False])
def test_ids_as_bytes_import_what_their_lists_import(on_host, held):
    src, dst = _source()
    if not on_host:
        src.host_places = dst.host_places = None
    if held:
        dst.reserve("moved", 38)  # (its tables longer than the state's counts)
    handle = export_state(src, "s")
    counts = src.layout.blocks_of(29)
    data = ids_bytes(handle.blocks, counts)
    assert data == _packed([i for kind in POOL_KINDS for i in handle.blocks[kind][: counts[kind]]])
    import_state(dst, src, handle._replace(blocks=data), "moved")
    table = dst.sequences["moved"].tables
    for kind, got, original in zip(POOL_KINDS, dst.tensors(), src.tensors(), strict=True):
        n = counts[kind]
        assert n and torch.equal(got[:, table[kind][:n]], original[:, handle.blocks[kind][:n]]), kind


@pytest.mark.parametrize("on_host", [True, False])
@pytest.mark.parametrize("bad", ["a byte short", "an id short", "an id more", "negative", "past the pool", "no ids"])
def test_ids_as_bytes_that_do_not_fit_raise_a_lookup_error(bad, on_host):
    src, dst = _source()
    if not on_host:
        src.host_places = dst.host_places = None
    free = {kind: a.free for kind, a in dst.allocators.items()}
    handle = export_state(src, "s")
    data = ids_bytes(handle.blocks, src.layout.blocks_of(29))
    data = {
        "a byte short": data[:-1],
        "an id short": data[:-8],
        "an id more": data + data[:8],
        "negative": _packed([-1]) + data[8:],
        "past the pool": _packed([src.blocks[POOL_KINDS[0]]]) + data[8:],
        "no ids": b"",
    }[bad]
    with pytest.raises(LookupError):
        import_state(dst, src, handle._replace(blocks=data), "moved")
    dst.release("moved")  # (what decode's refusal does: the request's blocks go back)
    assert {kind: a.free for kind, a in dst.allocators.items()} == free


@pytest.mark.parametrize("as_bytes", [True, False])
def test_the_copy_plan_is_counts_lengths_then_ids_as_host_copy_reads_it(as_bytes):
    """``_plan`` as ``copy_host_blocks``' docstring lays it out, written by hand: the counts, dst's
    lengths, src's lengths (bytes: the counts; a message's lists: their own), dst's ids, src's."""
    counts = dict(zip(POOL_KINDS, (2, 1, 0, 1, 1), strict=True))
    dst = {kind: array("q", ids) for kind, ids in zip(POOL_KINDS, ([5, 6], [9], [], [3], [0]), strict=True)}
    lists = dict(zip(POOL_KINDS, ([1, 2, 7], [4], [8], [2], [1]), strict=True))
    head = [2, 1, 0, 1, 1, 2, 1, 0, 1, 1]
    if as_bytes:
        want = [*head, 2, 1, 0, 1, 1, 5, 6, 9, 3, 0, 1, 2, 4, 2, 1]
        plan = _plan(counts, dst, ids_bytes({kind: array("q", ids) for kind, ids in lists.items()}, counts))
    else:
        want = [*head, 3, 1, 1, 1, 1, 5, 6, 9, 3, 0, 1, 2, 7, 4, 8, 2, 1]
        plan = _plan(counts, dst, lists)
    assert plan.dtype == np.int64 and plan.tolist() == want
