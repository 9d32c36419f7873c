"""What a CPU decode step dispatches to torch: the weights its compiled loops read are viewed in
numpy once, not per step (``kernels.norms_cpu.weight_array``), and a view follows a weight given
new memory."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill

from .conftest import random_ids
from .dispatched import OpNames


class OpsOn(TorchDispatchMode):
    """The aten ops dispatched inside it that take one of ``tensors`` (by memory) as an argument."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.addresses = {t.data_ptr(): name for name, t in tensors}
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for arg in [*args, *(kwargs or {}).values()]:
            if isinstance(arg, torch.Tensor) and arg.data_ptr() in self.addresses:
                self.seen.append((str(func), self.addresses[arg.data_ptr()]))
        return func(*args, **(kwargs or {}))


def _loop_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The fp32 weights the CPU decode path's compiled loops read: the blocks' norms (a compressor's
    goes into torch ops with its entries) and each mix's base and scale."""
    return [
        (name, p)
        for name, p in model.named_parameters()
        if name.endswith(("norm.weight", "hc_attn_base", "hc_attn_scale", "hc_ffn_base", "hc_ffn_scale"))
        and "compressor" not in name
    ]


def test_a_decode_step_dispatches_no_op_on_the_weights_its_loops_read(tiny_checkpoint):
    """``.numpy()`` is four aten ops (detach, to, resolve_conj, resolve_neg); it ran on every norm's
    weight and every mix's base and scale each step (~130 ops a demo decode step)."""
    model = load_model(tiny_checkpoint, progress=False)
    ids = random_ids(30, model.cfg.vocab_size, seed=3)
    pools = pools_for(model.cfg, torch.float32, 40, max_sequences=2)
    logits = prefill(model, pools, ["a", "b"], [ids[:20], ids[5:]])
    weights = _loop_weights(model)
    assert len(weights) > 4 * model.cfg.num_layers
    decode(model, pools, ["a", "b"], logits.argmax(-1).tolist())  # the first step may view them
    ops = OpsOn(weights)
    with ops:
        for _ in range(2):
            logits = decode(model, pools, ["a", "b"], logits.argmax(-1).tolist())
    assert ops.seen == []


def test_a_norm_weight_given_new_memory_is_read_anew():
    """The kept view is of the memory the weight had: ``param.data = ...`` (or a move) gives it new."""
    from dayzero.kernels.norms import rms_norm

    weight = torch.nn.Parameter(torch.ones(8), requires_grad=False)
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(2))
    first = rms_norm(x, weight, 1e-6)
    weight.data = torch.full((8,), 2.0)
    assert torch.equal(rms_norm(x, weight, 1e-6), 2 * first)
    weight.data.mul_(3)  # in place: the same memory, the view sees it
    assert torch.equal(rms_norm(x, weight, 1e-6), 6 * first)


def test_rope_on_the_cpu_reads_its_step_table_through_numpy_views_kept_once():
    """A CPU step's rope (14 calls a demo decode step) ran the torch twin: a copy, a slice, an unflatten,
    a complex view and the multiply on the table, five aten ops a call. The compiled loop reads the
    table through the numpy views the table keeps (``RopeTable.host``), so no aten op touches it;
    bitwise the twin's result."""
    from dayzero.kernels.rope import rotate_torch
    from dayzero.model.rope import RopeTable, apply_rope

    built = OpNames()
    with built:  # the inverse conjugated in numpy: torch's conj, resolve_conj and view were six aten ops
        table = RopeTable.at(1.0 / 10000 ** (torch.arange(0, 16, 2) / 16), torch.tensor([5, 130, 9]))
    assert built.names and not any("conj" in name for name in built.names)
    assert torch.equal(table.inverse, table.rotation.conj().resolve_conj())
    gen = torch.Generator().manual_seed(4)
    q, kv = torch.randn(3, 4, 32, generator=gen), torch.randn(3, 32, generator=gen)
    ops = OpsOn([("rotation", table.rotation), ("inverse", table.inverse)])
    with ops:
        got = [apply_rope(x, table, inverse) for x in (q, kv) for inverse in (False, True)]
    assert ops.seen == []
    want = [rotate_torch(x, r) for x in (q, kv) for r in (table.rotation, table.inverse)]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_decode_step_rotates_by_no_complex_view(tiny_checkpoint):
    """The torch twin's rope views its rows as complex numbers (``view_as_complex``), once a call; a
    CPU decode step of few fp32 tokens rotates in the compiled loop, so it dispatches none."""
    model = load_model(tiny_checkpoint, progress=False)
    pools = pools_for(model.cfg, torch.float32, 40, max_sequences=2)
    logits = prefill(model, pools, ["a", "b"], [random_ids(9, model.cfg.vocab_size, seed=5)] * 2)
    ops = OpNames()
    with ops:
        decode(model, pools, ["a", "b"], logits.argmax(-1).tolist())
    assert ops.names and "aten.view_as_complex.default" not in ops.names


def test_the_window_metadata_of_a_decode_step_is_built_on_the_host():
    """``DecodeWindow.build`` (once a step) took ~27 small torch ops (aranges, remainders, cats, the
    mask's comparisons, the ring slots' gathers): numpy on the host, only its results' wrapping
    (``lift_fresh``) dispatched; each layer writes its window rows with one ``index_copy_`` into the
    pool's rows, not an ``index_put_`` by block and row. What they compute: test_kernels' decode
    attention and window write against the spec."""
    from dayzero.kernels import DecodeWindow, RaggedBatch, write_window

    batch = RaggedBatch.build([0, 5, 37, 8], [1, 1, 1, 1])
    table = np.arange(8, dtype=np.int32).reshape(4, 2)
    built = OpNames()
    with built:
        ring = DecodeWindow.build(batch, table, 4, 8)
    assert set(built.names) == {"aten.lift_fresh.default"}
    kv, window, written = torch.ones(4, 16), torch.zeros(8, 4, 16), OpNames()
    with written:
        write_window(kv, batch, window, torch.from_numpy(table), at=ring.write_at)
    assert "aten.index_copy_.default" in written.names and "aten.index_put_.default" not in written.names


def test_a_batch_keeps_its_rows_host_values_as_built():
    """The window metadata and ring rows (twice a step) recomputed each row's sequence and position
    from ``starts`` / ``row0s`` / ``news`` (~15 us each): the builder's own arrays, the tensors' values."""
    from dayzero.kernels import RaggedBatch

    batch = RaggedBatch.build([0, 5, 37, 8], [1, 3, 0, 2])
    assert batch.host_seq.tolist() == batch.seq_of_token.tolist() == [0, 1, 1, 1, 3, 3]
    assert batch.host_positions.tolist() == batch.positions.tolist() == [0, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("experts", [[[5, 2]], [[3, 1], [1, 3], [7, 1], [0, 0]]])  # a token's; a batch's, ties
def test_a_cpu_moe_groups_its_pairs_on_the_host(experts):
    """One rank's CPU step sorts the routed pairs by expert and counts them in numpy from the ids
    read back (torch's stable argsort and the counting scatter were five ops, ~20 us a layer): in
    inference mode, as a step runs, ``tolist`` dispatches resolve_conj and resolve_neg (outside it,
    nothing), then the results' wrapping; the order and counts torch's stable sort and bincount give."""
    from dayzero.model.moe import _group_pairs
    from dayzero.parallel import Group

    ids, ops = torch.tensor(experts), OpNames()
    with torch.inference_mode(), ops:
        order, counts = _group_pairs(ids, 8, Group())
    assert ops.names == ["aten.resolve_conj.default", "aten.resolve_neg.default", *["aten.lift_fresh.default"] * 2]
    assert torch.equal(order, ids.flatten().argsort(stable=True))
    assert torch.equal(counts, torch.bincount(ids.flatten(), minlength=8))


def test_a_decode_step_buffers_fp32_compressor_rows_without_a_cast():
    """Each compressor buffers the step's kv and gate rows: ``float()`` of the fp32 rows was an aten
    op each (``to``, 10 a demo decode step) for nothing; bf16 rows are still cast (the buffer is fp32).
    One row (batch 1) was viewed first (``state.kv[slots, rows] =`` drops the value's leading 1): 10
    ``view`` ops a demo step more."""
    from dayzero.model.compressor import CompressorSlots, _decode_windows

    compressor = SimpleNamespace(ape=torch.zeros(4, 8))
    for dtype, n in ((torch.float32, 2), (torch.bfloat16, 2), (torch.float32, 1)):  # 1: a batch-1 step
        slots, rows = torch.tensor([2, 0][:n]), torch.tensor([1, 3][:n])
        state = CompressorSlots(torch.zeros(3, 4, 8), torch.zeros(3, 4, 8))
        kv, gate, ops = torch.ones(n, 8, dtype=dtype), torch.full((n, 8), 2.0, dtype=dtype), OpNames()
        with torch.inference_mode(), ops:  # as a step runs (outside it torch skips a same-type cast unseen)
            assert _decode_windows(compressor, state, kv, gate, slots, rows, None) is None
        if dtype == torch.float32:
            assert ops.names == ["aten.index_put_.default"] * 2
        assert torch.equal(state.kv[2, 1], torch.ones(8)) and torch.equal(state.gate[2, 1], torch.full((8,), 2.0))
        assert state.kv.count_nonzero() == 8 * n and state.gate.count_nonzero() == 8 * n
        assert n == 1 or torch.equal(state.gate[0, 3], torch.full((8,), 2.0))


def test_a_cpu_prefill_chunk_groups_its_pairs_with_torch():
    """A prefill chunk's pairs (hundreds to thousands) read back as Python ints and sorted in numpy
    took ~1 ms a layer at 1,024 pairs (torch's stable sort: ~20 us): they are torch's sort and count,
    the same order and counts."""
    from dayzero.model.moe import _group_pairs
    from dayzero.parallel import Group

    ids = torch.randint(0, 8, (512, 2), generator=torch.Generator().manual_seed(0))
    ops = OpNames()
    with ops:
        order, counts = _group_pairs(ids, 8, Group())
    assert "aten.sort.stable" in ops.names
    assert torch.equal(order, torch.from_numpy(np.argsort(ids.flatten().numpy(), kind="stable")))
    assert counts.tolist() == [int((ids == e).sum()) for e in range(8)]
