"""A step plan's block tables (``model.plan``): each sequence's blocks, zero-padded to the widest
(or a bucket's width), as the pools' tables hold them: scattered ids, ids past one byte."""

from __future__ import annotations

import torch

from dayzero.config import ModelConfig
from dayzero.kv.layout import GROWING_POOLS
from dayzero.kv.pools import pools_for
from dayzero.model.plan import AttentionOptions, Bucket, plan_step

from .conftest import tiny_config


def _padded(tables: list[list[int]], width: int) -> list[list[int]]:
    return [ids + [0] * (width - len(ids)) for ids in tables]


def _pools():
    """Sequences of 1, 40 and 300 tokens in blocks of 1 row, ids past one byte, c's scattered (it
    takes the blocks of a sequence released between the reservations first)."""
    cfg = ModelConfig.from_dict(tiny_config())
    pools = pools_for(cfg, torch.float32, 1200, max_sequences=5, block_size=1)
    for seq, length in (("held", 1000), ("gone", 29), ("a", 1), ("b", 40)):
        pools.reserve(seq, length)
    pools.release("gone")
    pools.reserve("c", 300)
    pools.reserve("pad", 8)
    return cfg, pools


def test_a_steps_tables_are_the_sequences_blocks_zero_padded():
    cfg, pools = _pools()
    ids, starts = ["a", "b", "c"], [0, 28, 299]
    plan = plan_step(cfg, pools, ids, starts, [[1], [2], [3]], AttentionOptions())
    tables = {kind: [list(pools.sequences[s].tables[kind]) for s in ids] for kind in ("window", *GROWING_POOLS)}
    c = tables["compressed_csa"][2]
    assert max(c) > 255 and c != list(range(c[0], c[0] + len(c)))
    for kind in GROWING_POOLS:
        width = max(map(len, tables[kind]))
        assert plan.tables[kind].dtype == torch.int32
        assert plan.tables[kind].tolist() == _padded(tables[kind], width), kind
    assert plan.window_table.tolist() == _padded(tables["window"], max(map(len, tables["window"])))


def test_a_buckets_tables_are_as_wide_as_the_bucket_the_pad_row_last():
    cfg, pools = _pools()
    ids, bucket = ["a", "b"], Bucket(3, 64, "pad")
    plan = plan_step(cfg, pools, ids, [0, 28], [[1], [2]], AttentionOptions(backend="triton"), bucket)
    for kind in GROWING_POOLS:
        width = pools.layout.blocks_for(kind, 64)
        rows = [list(pools.sequences[s].tables[kind])[:width] for s in [*ids, "pad", "pad"]]
        assert plan.tables[kind].tolist() == _padded(rows, width), kind
