"""The compiled block copy between host pools (kv.host_copy) against its torch twin
(kv.handoff.copy_blocks), bitwise: odd block sizes, scattered ids, every dtype a pool can hold
(and fp8, whose bytes torch's index_copy cannot move), a sequence's last partial block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kv.handoff import copy_blocks, export_state, import_state
from dayzero.kv.host_copy import copy_host_blocks
from dayzero.kv.layout import POOL_KINDS
from dayzero.kv.places import places_of
from dayzero.kv.pools import pools_for

from .conftest import tiny_config

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn]

# (dst ids, src ids) of each kind: a stretch, scattered, reversed, runs broken on one side, none
IDS = [
    ([2, 3, 4], [5, 6, 7]),
    ([4, 0, 2], [1, 6, 3]),
    ([3, 2, 1, 0], [0, 1, 2, 3]),
    ([1, 2, 6, 7, 8], [5, 7, 0, 1, 2]),
    ([], []),
]
LAYERS = [2, 1, 3, 2, 1]


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _plan(ids: list[tuple[list[int], list[int]]]) -> np.ndarray:
    """Each kind's count, its lists' lengths (the count: the lists copied whole), the lists."""
    counts = [len(dst) for dst, _ in ids]
    lists = [b for dst, _ in ids for b in dst] + [b for _, src in ids for b in src]
    return np.array(counts * 3 + lists, dtype=np.int64)


def _twin(dst: torch.Tensor, src: torch.Tensor, dst_ids: list[int], src_ids: list[int]) -> None:
    if dst_ids:  # (fp8: index_copy has no fp8 kernel on CPU; its bytes are the same copy)
        as_bytes = dst.dtype.itemsize == 1
        copy_blocks(*(t.view(torch.uint8) if as_bytes else t for t in (dst, src)), dst_ids, src_ids)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("block_rows", "width"), [(3, 5), (1, 1), (4, 7)])
def test_the_compiled_copy_is_its_torch_twins_bitwise(dtype, block_rows, width):
    """Five kinds at once, pools of different sizes (their layers lie apart differently), blocks
    of odd byte counts."""
    srcs = [_random((n, 11, block_rows, width), dtype, i) for i, n in enumerate(LAYERS)]
    dsts = [_random((n, 9, block_rows, width), dtype, 10 + i) for i, n in enumerate(LAYERS)]
    want = [t.clone() for t in dsts]
    for w, s, (dst_ids, src_ids) in zip(want, srcs, IDS, strict=True):
        _twin(w, s, dst_ids, src_ids)
    copy_host_blocks(places_of(dsts), places_of(srcs), _plan(IDS))
    for got, w in zip(dsts, want, strict=True):
        assert torch.equal(got.view(torch.uint8), w.view(torch.uint8))


def test_a_pool_with_no_blocks_of_a_kind_takes_the_others():
    """A carrier sized for a short state (redis transport's, a rank's adopt) has no blocks of a
    compressed kind: its blocks still have their bytes, the other kinds copy."""
    src = [_random((2, 4, 3, 5), torch.float32, i) for i in range(2)]
    dst = [_random((2, 1, 3, 5), torch.float32, 5), torch.empty(2, 0, 3, 5)]
    copy_host_blocks(places_of(dst), places_of(src), _plan([([0], [3]), ([], [])]))
    assert torch.equal(dst[0][:, 0], src[0][:, 3])


def test_a_stretch_overlapping_its_source_in_one_pool_copies_as_through_a_buffer():
    """(One stretch: memmove. Stretches that swap blocks do not: host_copy says so.)"""
    pool = _random((2, 8, 3, 5), torch.float32, 0)
    want = pool.clone()
    want[:, [1, 2, 3]] = pool[:, [2, 3, 4]].clone()
    places = places_of([pool])
    copy_host_blocks(places, places, _plan([([1, 2, 3], [2, 3, 4])]))
    assert torch.equal(pool, want)


@pytest.mark.parametrize(
    ("ids", "error"),
    [
        ([([0, 9], [0, 1])], IndexError),  # past the destination pool's 9 blocks
        ([([0, 1], [0, 11])], IndexError),  # past the source's 11 (a message's ids)
        ([([0, 1], [-1, 0])], IndexError),
    ],
)
def test_ids_outside_their_pool_raise_before_a_byte_moves(ids, error):
    src, dst = _random((2, 11, 3, 5), torch.float32, 1), _random((2, 9, 3, 5), torch.float32, 2)
    before = dst.clone()
    ok = ([1, 2], [3, 4])  # a kind before the bad one is not copied either
    with pytest.raises(error):
        copy_host_blocks(places_of([dst, dst]), places_of([src, src]), _plan([ok, *ids]))
    assert torch.equal(dst, before)


def test_a_plan_or_pools_that_do_not_match_raise():
    src, dst = _random((2, 11, 3, 5), torch.float32, 1), _random((2, 9, 3, 5), torch.float32, 2)
    plan = _plan([([1, 2], [3, 4])])
    with pytest.raises(ValueError, match="lengths"):
        copy_host_blocks(places_of([dst]), places_of([src]), plan[:-1])  # a src id short
    with pytest.raises(ValueError, match="counts"):
        copy_host_blocks(places_of([dst]), places_of([src]), np.array([1, 1], dtype=np.int64))
    with pytest.raises(ValueError, match="lengths"):
        copy_host_blocks(places_of([dst]), places_of([src]), np.array([-1, 0, 0], dtype=np.int64))
    wrapping = np.zeros(1 << 16, dtype=np.int64)  # lengths whose sum wraps to 0 past int64; zeros after the
    wrapping[4:12] = 1 << 62  # plan's end, in the same buffer, read as ids if the sum were trusted
    with pytest.raises(ValueError, match="lengths"):
        copy_host_blocks(places_of([dst] * 4), places_of([src] * 4), wrapping[:12])
    with pytest.raises(IndexError, match="fewer"):  # a list shorter than its count (a message's)
        copy_host_blocks(places_of([dst]), places_of([src]), np.array([2, 2, 1, 1, 2, 3], dtype=np.int64))
    other = _random((2, 11, 3, 4), torch.float32, 3)  # blocks of other bytes
    with pytest.raises(ValueError, match="differ"):
        copy_host_blocks(places_of([dst]), places_of([other]), plan)
    with pytest.raises(ValueError, match="contiguous"):
        places_of([src[:, :, :2]])


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("mtp", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_import_state_on_host_equals_the_twins_import(dtype, mtp, held):
    """A 29-token state in blocks of 3 rows (the last compressed blocks partial) into pools whose
    free blocks are scattered: the compiled import leaves the pools bitwise as the twin's does.
    Its blocks run past what 29 tokens need (prefill reserved more), and ``held``: the destination
    already holds a longer sequence (Ranks.copy's identical prompt): the plan's lists are longer
    than their counts, each one's first ``count`` copied."""
    cfg = ModelConfig.from_dict(tiny_config())
    src = pools_for(cfg, dtype, 40, max_sequences=2, block_size=3, mtp=mtp)
    src.reserve("other", 20)
    src.reserve("s", 38)
    src.sequences["s"].length = 29
    for i, tensor in enumerate(src.tensors()):
        tensor.copy_(_random(tuple(tensor.shape), tensor.dtype, i))
    dsts = []
    for _ in range(2):
        dst = pools_for(cfg, dtype, 40, max_sequences=4, block_size=3, mtp=mtp)
        for seq, length in (("a", 7), ("b", 17), ("c", 11)):
            dst.reserve(seq, length)
        dst.release("b")  # its blocks back, between a's and c's
        dst.reserve("d", 4)
        dsts.append(dst)
    compiled, twin = dsts
    twin.host_places = None  # (the torch path, as pools on a device take)
    for dst in dsts:
        if held:
            dst.reserve("moved", 38)
        import_state(dst, src, export_state(src, "s"), "moved")
    table, counts = compiled.sequences["moved"].tables, src.layout.blocks_of(29)
    assert any(len(src.sequences["s"].tables[kind]) > n for kind, n in counts.items())
    assert any(len(table[kind]) > n for kind, n in counts.items()) == held
    assert table == twin.sequences["moved"].tables
    assert any(list(ids) != list(range(ids[0], ids[0] + len(ids))) for ids in table.values())  # scattered
    for kind, got, want, original in zip(POOL_KINDS, compiled.tensors(), twin.tensors(), src.tensors(), strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), kind
        n = counts[kind]
        assert torch.equal(got[:, table[kind][:n]], original[:, src.sequences["s"].tables[kind][:n]]), kind


def test_a_host_pools_storage_cannot_be_put_in_another_tensors_place():
    """``host_places`` holds the storage's addresses: a tensor assigned in its place would leave the
    compiled copy writing memory freed with the old one; it is refused instead."""
    pools = pools_for(ModelConfig.from_dict(tiny_config()), torch.float32, 8)
    addresses = pools.host_places[:, 0].tolist()
    with pytest.raises(AttributeError):
        pools.window = pools.window.clone()
    with pytest.raises(AttributeError):
        pools.compressor_storage = pools.compressor_storage.clone()
    with pytest.raises(TypeError):
        pools.compressed["index_keys"] = pools.compressed["index_keys"].clone()
    with pytest.raises(AttributeError):
        pools.compressed = {}
    assert [t.data_ptr() for t in pools.tensors()] == addresses


@pytest.mark.parametrize("on_host", [True, False])
@pytest.mark.parametrize("bad", ["past int64", "too few", "negative", "past the pool", "a stretch from the end"])
def test_a_states_ids_that_do_not_fit_raise_a_lookup_error(bad, on_host):
    """Decode's admission gives a LookupError's request back to be re-run; any other error was
    retried every pass of its loop (struct.error for an id past int64: numpy's IndexError before).
    The torch path (pools on a GPU) the same: it raised RuntimeError, or copied a stretch counted
    from the pool's end, and on a GPU an id past the pool is a device-side assert."""
    cfg = ModelConfig.from_dict(tiny_config())
    src, dst = (pools_for(cfg, torch.float32, 40, block_size=3) for _ in range(2))  # 3 compressed_csa blocks
    if not on_host:
        src.host_places = dst.host_places = None
    src.reserve("s", 29)
    src.sequences["s"].length = 29
    handle = export_state(src, "s")
    csa, blocks = handle.blocks["compressed_csa"], src.blocks["compressed_csa"]
    ids = {
        "past int64": (1 << 63, *csa[1:]),
        "too few": csa[1:],
        "negative": (-1, *csa[1:]),
        "past the pool": (blocks, *csa[1:]),
        "a stretch from the end": tuple(range(-len(csa) - 1, -1)),
    }[bad]
    with pytest.raises(LookupError):
        import_state(dst, src, handle._replace(blocks={**handle.blocks, "compressed_csa": ids}), "moved")
