"""Block pools (allocation, budget, capacity) and the state handoff between pools."""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.config import ModelConfig
from dayzero.kv.handoff import LayoutMismatch, copy_blocks, export_state, import_state
from dayzero.kv.layout import PoolLayout
from dayzero.kv.pools import KVPools, OutOfBlocks, pools_for
from dayzero.model.forward import decode, prefill

from .conftest import random_ids, tiny_config


def _layout(block_size=4):
    return PoolLayout.of(ModelConfig.from_dict(tiny_config()), block_size, "float32")


def test_reserve_release_and_usage():
    pools = KVPools.sized(_layout(), max_tokens=64, max_sequences=2, dtype=torch.float32)
    baseline = pools.usage()
    assert all(used == 0 for used, _ in baseline.values())
    pools.reserve("a", 40)
    used = pools.usage()
    assert used["window"][0] == 2 and used["compressed_csa"][0] == 3 and used["compressed_hca"][0] == 2
    assert used["compressor"][0] == 1 and used["index_keys"][0] == 3
    assert pools.reserve("a", 47) == {}  # 11 CSA entries, 5 HCA: the blocks it holds
    added = pools.reserve("a", 52)  # a 13th CSA entry (and its indexer key): one block each
    assert {k: len(v) for k, v in added.items()} == {
        "window": 0,
        "compressed_csa": 1,
        "compressed_hca": 0,
        "index_keys": 1,
        "compressor": 0,
    }
    pools.reserve("a", 64)  # grows in place
    pools.reserve("b", 64)
    assert not pools.fits(10)  # a third sequence has no window / compressor slot
    with pytest.raises(OutOfBlocks) as err:
        pools.reserve("c", 10)
    assert not err.value.permanent and "c" not in pools.sequences
    pools.release("a")
    pools.release("b")
    assert pools.usage() == baseline


def test_a_reservation_that_fails_at_a_later_pool_gives_back_what_it_took_as_it_was():
    """All or nothing: "b" gets its window blocks, then finds no compressed block; the window blocks
    go back to where they were in the free list (the next reservation takes the same ones)."""
    pools = KVPools.sized(_layout(), max_tokens=64, max_sequences=2, dtype=torch.float32)
    pools.reserve("a", 120)  # the growing pools' blocks meant for a second sequence too
    free = {kind: list(allocator._free) for kind, allocator in pools.allocators.items()}  # noqa: SLF001
    assert free["window"] and not free["compressed_csa"]
    with pytest.raises(OutOfBlocks) as err:
        pools.reserve("b", 40)
    assert not err.value.permanent and "b" not in pools.sequences
    assert {kind: list(allocator._free) for kind, allocator in pools.allocators.items()} == free  # noqa: SLF001


def test_a_reservation_adds_blocks_exactly_when_the_held_ones_run_out():
    """Counted by hand for the tiny layout (a CSA entry every 4 tokens, an HCA entry every 8, 4
    entries a block): 40 tokens hold 3 CSA blocks (room for 12 entries: up to 51 tokens) and 2 HCA
    blocks (8 entries: up to 71). The same after a rollback returns a block."""
    pools = KVPools.sized(_layout(), max_tokens=128, max_sequences=1, dtype=torch.float32)
    pools.reserve("a", 40)
    assert pools.reserve("a", 51) == {}
    added = pools.reserve("a", 52)
    assert {k: len(v) for k, v in added.items() if v} == {"compressed_csa": 1, "index_keys": 1}
    assert pools.reserve("a", 67) == {}  # 16 CSA entries fit in 4 blocks
    pools.commit("a", 40)
    pools.rollback("a", added)  # the 40 tokens kept need 3 CSA blocks: the 4th goes back
    assert pools.reserve("a", 51) == {}
    assert {k: len(v) for k, v in pools.reserve("a", 52).items() if v} == {"compressed_csa": 1, "index_keys": 1}
    assert {k: len(v) for k, v in pools.reserve("a", 72).items() if v} == {
        "compressed_csa": 1,  # 18 entries: a 5th block
        "index_keys": 1,
        "compressed_hca": 1,  # a 9th HCA entry
    }


def test_over_long_request_is_a_permanent_error():
    pools = KVPools.sized(_layout(), max_tokens=64, max_sequences=1, dtype=torch.float32)
    assert pools.capacity_tokens() >= 64
    with pytest.raises(OutOfBlocks, match="exceed the attention-state capacity") as err:
        pools.reserve("a", 10_000)
    assert err.value.permanent


def test_an_import_takes_its_blocks_all_or_nothing_and_refuses_a_state_longer_than_the_pools():
    """``hold`` (an import's new sequence) as ``reserve``: pools full now give back what they took
    as it was (a retry), a state longer than the pools ever hold is the permanent error."""
    src = KVPools.sized(_layout(), max_tokens=200, max_sequences=1, dtype=torch.float32)
    src.reserve("s", 40)
    src.sequences["s"].length = 40
    full = KVPools.sized(_layout(), max_tokens=64, max_sequences=2, dtype=torch.float32)
    full.reserve("a", 120)  # a window slot left, no compressed block
    free = {kind: list(allocator._free) for kind, allocator in full.allocators.items()}  # noqa: SLF001
    with pytest.raises(OutOfBlocks) as err:
        import_state(full, src, export_state(src, "s"), "moved")
    assert not err.value.permanent and "moved" not in full.sequences
    assert {kind: list(allocator._free) for kind, allocator in full.allocators.items()} == free  # noqa: SLF001
    short = KVPools.sized(_layout(), max_tokens=16, max_sequences=1, dtype=torch.float32)
    with pytest.raises(OutOfBlocks, match="exceed the attention-state capacity") as err:
        import_state(short, src, export_state(src, "s"), "moved")
    assert (
        err.value.permanent
        and "moved" not in short.sequences
        and short.usage() == {kind: (0, total) for kind, (_, total) in short.usage().items()}
    )


def test_budget_sizes_the_pools():
    layout = _layout()
    pools = KVPools.from_budget(layout, budget_bytes=1 << 20, max_sequences=4, dtype=torch.float32)
    total = sum(
        t.numel() * t.element_size() for t in [pools.window, *pools.compressed.values(), *pools.compressor.values()]
    )
    assert total <= (1 << 20) * 1.01 and pools.capacity_tokens() > 1000
    with pytest.raises(ValueError, match="cannot hold"):
        KVPools.from_budget(layout, budget_bytes=1000, max_sequences=4, dtype=torch.float32)


KINDS = ["window", "compressed_csa", "compressed_hca", "index_keys", "compressor"]


def _forget(pools: KVPools, seq_id: str, kind: str) -> None:
    """Simulate a handoff that did not carry one kind of state."""
    tables = pools.sequences[seq_id].tables
    if kind == "window":
        pools.window[:, tables["window"]] = 0
    elif kind == "compressor":
        for tensor in pools.compressor.values():
            tensor[:, tables["compressor"][0]] = 0
    else:
        pools.compressed[kind][:, tables[kind]] = 0


def _continue(model, pools, seq, tokens):
    """Logits after feeding ``tokens`` one decode step at a time: [steps, V]."""
    return torch.stack([decode(model, pools, [seq], [t])[0] for t in tokens])


@pytest.mark.parametrize("forgotten", [None, *KINDS])
def test_handoff_moves_every_kind_of_state(tiny_checkpoint, forgotten):
    model = load_model(tiny_checkpoint, progress=False)
    prompt = random_ids(43, model.cfg.vocab_size, seed=11)  # 43 % 4 and 43 % 8 leave buffered rows
    a = pools_for(model.cfg, torch.float32, 80)
    b = pools_for(model.cfg, torch.float32, 80, max_sequences=2)
    b.reserve("other", 30)  # so the destination blocks differ from the source's
    first = prefill(model, a, ["s"], [prompt])[0]
    handle = export_state(a, "s")
    import_state(b, a, handle, "moved")
    if forgotten:
        _forget(b, "moved", forgotten)
    follow = [int(first.argmax()), *random_ids(23, model.cfg.vocab_size, seed=12)]  # crosses boundaries
    moved = _continue(model, b, "moved", follow)
    stayed = _continue(model, a, "s", follow)
    if forgotten is None:
        assert torch.equal(moved, stayed)
        assert torch.equal(moved.argmax(-1), stayed.argmax(-1))
    else:  # each kind matters: without it the continuation's logits move
        assert (moved - stayed).abs().max().item() > 1e-3


@pytest.mark.parametrize(
    ("dst_ids", "src_ids"),
    [([2, 3, 4], [5, 6, 7]), ([4, 0, 2], [1, 6, 3]), ([1, 2], [7, 5]), ([2, 3], [3, 4]), ([2, 4, 3, 5], [1, 2, 3, 4])],
)
def test_block_copy_equals_indexed_assignment(dst_ids, src_ids):
    """Stretches of consecutive blocks are one slice copy, scattered ids a gather + scatter (ends
    that look like a stretch around a middle that is not: indexed). The host pools' compiled
    copy: test_kv_host_copy."""
    gen = torch.Generator().manual_seed(3)
    src, dst = (torch.randn(2, 8, 4, 3, generator=gen).bfloat16() for _ in range(2))
    want = dst.clone()
    want[:, dst_ids] = src[:, src_ids]
    copy_blocks(dst, src, dst_ids, src_ids)
    assert torch.equal(dst, want)


def test_handoff_refuses_another_layout(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    a = pools_for(model.cfg, torch.float32, 40)
    other = pools_for(model.cfg, torch.float32, 40, block_size=8)
    prefill(model, a, ["s"], [[1, 2, 3, 4, 5]])
    with pytest.raises(LayoutMismatch):
        import_state(other, a, export_state(a, "s"), "s")


def test_segments_of_dead_workers_are_swept(tmp_path):
    import os
    import subprocess

    from dayzero.shm import sweep_stale

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that has exited (and been reaped)
    (tmp_path / f"dz-kv-{dead.pid}-deadbeef").write_bytes(b"x")
    (tmp_path / f"dz-kv-{os.getpid()}-cafe1234").write_bytes(b"x")  # this process: alive
    (tmp_path / "unrelated").write_bytes(b"x")
    assert sweep_stale(tmp_path) == [f"dz-kv-{dead.pid}-deadbeef"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"dz-kv-{os.getpid()}-cafe1234", "unrelated"]


def test_layout_hash_covers_how_the_storage_is_carved(tiny_checkpoint, monkeypatch):
    """Two processes map one shared segment by allocating in the same order with the same shapes:
    the hash a handoff checks must change when either does, and not with the pools' sizes."""
    from dayzero.config import ModelConfig

    cfg = ModelConfig.from_file(tiny_checkpoint)
    small, large = pools_for(cfg, torch.float32, 32), pools_for(cfg, torch.float32, 256, max_sequences=3)
    assert small.layout.hash() == large.layout.hash() and small.layout_hash == large.layout_hash
    real = PoolLayout.compressor_shapes

    def reordered(layout):  # the same compressor states carved from a slot in another order
        shapes = real(layout)
        return {name: shapes[name] for name in reversed(shapes)}

    monkeypatch.setattr(PoolLayout, "compressor_shapes", reordered)
    moved = pools_for(cfg, torch.float32, 32)
    assert moved.layout.hash() == small.layout.hash() and moved.layout_hash != small.layout_hash
