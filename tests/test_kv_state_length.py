"""A state's length comes from a message (a StateRef, or the header of a state parked in Redis):
one below 0 is refused where the message is read. ``blocks_of(-100)`` counts -1 compressed blocks,
and ``alloc(-1)`` handed out every block of the pool but one."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from pydantic import ValidationError

from dayzero.config import ModelConfig
from dayzero.kv.blocks import BlockAllocator, take
from dayzero.kv.handoff import LayoutMismatch
from dayzero.kv.pools import pools_for
from dayzero.serving.handoff import pack_state, publish, unpack_state
from dayzero.serving.messages import StateRef

from .conftest import tiny_config


def _pools():
    pools = pools_for(ModelConfig.from_dict(tiny_config()), torch.float32, 200)
    pools.reserve("s", 9)
    pools.sequences["s"].length = 9
    return pools


def test_a_state_ref_of_negative_length_is_refused():
    written = json.loads(publish(_pools(), "s", "r", "shm", None, ttl_s=30).model_dump_json())
    assert StateRef.model_validate_json(json.dumps(written)).length == 9
    with pytest.raises(ValidationError, match="length"):
        StateRef.model_validate_json(json.dumps({**written, "length": -100}))


def test_a_parked_state_of_negative_length_is_refused():
    pools = _pools()
    data = pack_state(pools, "s")
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    state = json.loads(header["__metadata__"]["dayzero_state"])
    header["__metadata__"]["dayzero_state"] = json.dumps({**state, "length": -100})
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # (safetensors: the buffers start 8-aligned)
    tampered = struct.pack("<Q", len(text)) + text + data[8 + size :]
    assert unpack_state(data, pools)[1].length == 9
    with pytest.raises(LayoutMismatch, match="length"):
        unpack_state(tampered, pools)


def test_the_allocator_refuses_a_negative_count():
    """Only message parsing guarded it: ``alloc(-1)`` handed out every block but one."""
    allocator = BlockAllocator(8)
    with pytest.raises(ValueError, match="-1 blocks"):
        allocator.alloc(-1)
    assert allocator.free == 8


def test_take_refusing_a_negative_count_gives_back_what_it_took():
    allocators = {"window": BlockAllocator(4), "compressor": BlockAllocator(4)}
    with pytest.raises(ValueError, match="-2 blocks"):
        take(allocators, {"window": 3, "compressor": -2}, 9)
    assert [a.free for a in allocators.values()] == [4, 4]
