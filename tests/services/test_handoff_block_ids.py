"""A handoff message's block ids, through its JSON as decode reads it: as lists (DAYZERO_HANDOFF_IDS
=lists: the message holds the fields a decode two releases back knows) or as int64 bytes (``bytes``, the
default: base64 under ``block_ids``, no lists); decode takes either. Bytes that are no base64, or do not fit the
state, raise a LookupError where the state is received (decode gives the request back to be re-run
and releases its blocks), as lists that do not fit do: not a refusal of the whole message."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kv.layout import POOL_KINDS, PoolLayout
from dayzero.kv.pools import KVPools
from dayzero.kv.shared import SharedPools
from dayzero.serving.handoff import Receiver, publish
from dayzero.serving.messages import StateRef

from ..conftest import tiny_config


@pytest.fixture
def source():
    """Shared pools (as a prefill worker's) holding a random 29-token state ``s``."""
    layout = PoolLayout.of(ModelConfig.from_dict(tiny_config()), 3, "float32")
    blocks = KVPools.sized(layout, 40, 2, torch.float32, device="meta").blocks
    src, segment = SharedPools.create(layout, blocks, torch.float32)
    src.reserve("other", 20)
    src.reserve("s", 29)
    src.sequences["s"].length = 29
    for i, tensor in enumerate(src.tensors()):
        tensor.copy_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(i)))
    receiver = Receiver(store=None)  # (the store serves the redis transport only)
    yield src, receiver
    receiver.close()
    del src
    segment.close()
    segment.unlink()


def _sent(src: KVPools, ids: str) -> dict:
    return json.loads(publish(src, "s", "r", "shm", None, ttl_s=30, ids=ids).model_dump_json())


def _received(src: KVPools, receiver: Receiver, message: dict) -> KVPools:
    dst = KVPools(src.layout, src.blocks, torch.float32)
    dst.reserve("first", 5)  # (its blocks not the source's)
    receiver.receive(StateRef.model_validate_json(json.dumps(message)), dst, "moved")
    return dst


def test_a_state_sent_as_bytes_is_received_as_its_lists_are(source):
    src, receiver = source
    lists, packed = _sent(src, "lists"), _sent(src, "bytes")
    assert "blocks" in lists and "block_ids" not in lists  # what a decode two releases back reads
    assert "block_ids" in packed and "blocks" not in packed
    assert set(lists) - {"blocks"} == set(packed) - {"block_ids"}
    for message in (lists, packed):
        dst = _received(src, receiver, message)
        counts, table = src.layout.blocks_of(29), dst.sequences["moved"].tables
        for kind, got, original in zip(POOL_KINDS, dst.tensors(), src.tensors(), strict=True):
            n = counts[kind]
            assert torch.equal(got[:, table[kind][:n]], original[:, src.sequences["s"].tables[kind][:n]]), kind


@pytest.mark.parametrize("bad", ["no base64", "an id short", "an id more", "a byte more", "past the pool"])
def test_block_ids_that_are_malformed_raise_a_lookup_error_and_release(source, bad):
    src, receiver = source
    message = _sent(src, "bytes")
    data = base64.b64decode(message["block_ids"])
    message["block_ids"] = {
        "no base64": "%%%",
        "an id short": base64.b64encode(data[:-8]).decode(),
        "an id more": base64.b64encode(data + data[:8]).decode(),
        "a byte more": base64.b64encode(data + b"\0").decode(),
        "past the pool": base64.b64encode((1 << 40).to_bytes(8, "little") + data[8:]).decode(),
    }[bad]
    dst = KVPools(src.layout, src.blocks, torch.float32)
    free = {kind: a.free for kind, a in dst.allocators.items()}
    with pytest.raises(LookupError):
        receiver.receive(StateRef.model_validate_json(json.dumps(message)), dst, "moved")
    dst.release("moved")  # (decode's refusal: the request given back, its blocks with it)
    assert {kind: a.free for kind, a in dst.allocators.items()} == free
