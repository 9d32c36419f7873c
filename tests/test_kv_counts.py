"""A handoff's bookkeeping: the bytes a sequence holds and the length its blocks hold are counted
from its block tables, never by touching the state (decode counts every state it imports)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kv.layout import GROWING_POOLS, PoolLayout
from dayzero.kv.pools import pools_for

from .conftest import tiny_config
from .dispatched import OpNames


@pytest.mark.parametrize("mtp", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sequence_bytes_counts_blocks_without_gathering_them(dtype, mtp):
    pools = pools_for(ModelConfig.from_dict(tiny_config()), dtype, 200, max_sequences=2, block_size=4, mtp=mtp)
    pools.reserve("short", 7)
    pools.reserve("long", 150)
    for seq in ("short", "long"):
        tables = pools.sequences[seq].tables
        gathered = [pools.window[:, tables["window"]], pools.compressor_storage[:, tables["compressor"]]]
        gathered += [storage[:, tables[kind]] for kind, storage in pools.compressed.items()]
        with OpNames() as seen:
            counted = pools.sequence_bytes(seq)
        assert seen.names == []  # (it gathered every block of the state: ~0.1 ms for a 4k demo state)
        assert counted == sum(t.numel() * t.element_size() for t in gathered)


@pytest.mark.parametrize(("csa", "hca"), [((1,), (2,)), ((1,), ()), ((), (2,)), ((), ())])
def test_longest_held_is_the_longest_length_the_blocks_hold(csa, hca):
    layout = dataclasses.replace(
        PoolLayout.of(ModelConfig.from_dict(tiny_config()), 4, "float32"), csa_layers=csa, hca_layers=hca
    )
    for blocks in (
        {"compressed_csa": 3, "compressed_hca": 1, "index_keys": 3},
        {"compressed_csa": 2, "compressed_hca": 5, "index_keys": 1},
    ):

        def fits(length: int, blocks=blocks) -> bool:
            return all(layout.blocks_of(length)[pool] <= blocks[pool] for pool in GROWING_POOLS)

        held = layout.longest_held(blocks)
        if fits(10_000):  # no growing pool: any length
            assert held >= 10_000
        else:
            assert fits(held) and not fits(held + 1)
