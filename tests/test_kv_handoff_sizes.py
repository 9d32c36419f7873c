"""A state received as decode receives it (published into shared memory, its message through
JSON), at odd sizes: 1 token (no compressed entry yet), 29 (each pool's last block partial), 397
(blocks scattered in both pools: several stretches a kind), block ids as bytes and as lists, on
the compiled host copy and the torch path. Each of its blocks, byte for byte, is the source's
block its table names, and no other block of the destination changes."""

from __future__ import annotations

import json

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kv.layout import POOL_KINDS, PoolLayout
from dayzero.kv.pools import KVPools
from dayzero.kv.shared import SharedPools
from dayzero.serving.handoff import Receiver, publish
from dayzero.serving.messages import StateRef

from .conftest import tiny_config


def _scattered(pools: KVPools, first: int) -> None:
    """Sequences reserved with one released between them: the next one's blocks are not one stretch."""
    for seq, length in (("x", first), ("gap", 50), ("y", 40)):
        pools.reserve(seq, length)
    pools.release("gap")


def _random(pools: KVPools, seed: int) -> None:
    for i, tensor in enumerate(pools.tensors()):
        tensor.copy_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed + i)))


@pytest.mark.parametrize("on_host", [True, False])
@pytest.mark.parametrize("ids", ["bytes", "lists"])
@pytest.mark.parametrize("length", [1, 29, 397])
def test_a_received_state_is_its_sources_blocks_byte_for_byte(length, ids, on_host):
    layout = PoolLayout.of(ModelConfig.from_dict(tiny_config()), 3, "float32")
    blocks = KVPools.sized(layout, 400, 3, torch.float32, device="meta").blocks
    src, segment = SharedPools.create(layout, blocks, torch.float32)
    receiver = Receiver(store=None)
    try:
        _scattered(src, 100)
        src.reserve("s", length)
        src.sequences["s"].length = length
        _random(src, 0)
        message = publish(src, "s", "r", "shm", None, ttl_s=30, ids=ids).model_dump_json()
        dst = KVPools(layout, blocks, torch.float32)
        _scattered(dst, 30)
        _random(dst, 10)
        before = [t.clone() for t in dst.tensors()]
        if not on_host:
            dst.host_places = None  # (the torch path, as pools on a device take)
        receiver.receive(StateRef.model_validate(json.loads(message)), dst, "moved")
        counts, table, source = layout.blocks_of(length), dst.sequences["moved"].tables, src.sequences["s"].tables
        if length == 397:
            assert all(list(t) != list(range(t[0], t[0] + len(t))) for t in (table["index_keys"], source["index_keys"]))
        for kind, got, original, old in zip(POOL_KINDS, dst.tensors(), src.tensors(), before, strict=True):
            n = counts[kind]
            assert len(table[kind]) == n, kind
            assert torch.equal(
                got[:, list(table[kind])].view(torch.uint8), original[:, source[kind][:n]].view(torch.uint8)
            )
            untouched = [b for b in range(got.shape[1]) if b not in table[kind]]
            assert torch.equal(got[:, untouched], old[:, untouched]), kind
    finally:
        receiver.close()
        del src
        segment.close()
        segment.unlink()
