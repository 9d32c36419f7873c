"""Incremental decoding and chunked prefill equal one full forward over the same tokens."""

from __future__ import annotations

import torch

from dayzero.checkpoint import load_model
from dayzero.model.forward import decode, prefill, score
from dayzero.model.state import SequenceState

from .conftest import random_ids

# Same weights, same fp32 maths, only the split into steps differs: rounding-level agreement.
TOL = 1e-5


def test_decode_steps_equal_full_forward(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    ids = random_ids(90, model.cfg.vocab_size, seed=5)
    full = score(model, ids, SequenceState.new(model.cfg, torch.float32))
    state = SequenceState.new(model.cfg, torch.float32)
    first = prefill(model, [ids[:21]], [state])[0]  # 21: mid-window of every compressor
    errors = [(first - full[20]).abs().max().item()]
    for t in range(21, 90):  # 69 decode steps crossing CSA (4) and HCA (8) boundaries
        logits = decode(model, [ids[t]], [state])[0]
        if t + 1 < 90:
            errors.append((logits - full[t]).abs().max().item())
    assert state.length == 90
    assert max(errors) < TOL


def test_chunked_prefill_equals_full_forward(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    ids = random_ids(64, model.cfg.vocab_size, seed=6)
    full = score(model, ids, SequenceState.new(model.cfg, torch.float32))
    for chunk in (1, 3, 7, 16):
        got = prefill(model, [ids], [SequenceState.new(model.cfg, torch.float32)], chunk_size=chunk)[0]
        assert (got - full[-1]).abs().max().item() < TOL


def test_batched_decode_keeps_sequences_apart(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    a, b = random_ids(30, model.cfg.vocab_size, seed=7), random_ids(11, model.cfg.vocab_size, seed=8)
    states = [SequenceState.new(model.cfg, torch.float32) for _ in range(2)]
    prefill(model, [a, b], states)
    batched = decode(model, [5, 9], states)
    for ids, tok, row in ((a, 5, 0), (b, 9, 1)):
        alone = score(model, [*ids, tok], SequenceState.new(model.cfg, torch.float32))[-1]
        assert (batched[row] - alone).abs().max().item() < TOL


def test_state_holds_all_four_kinds(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    state = SequenceState.new(model.cfg, torch.float32)
    prefill(model, [random_ids(30, model.cfg.vocab_size, seed=9)], [state])
    sliding, csa, hca = state.layers
    assert sliding.window.shape[0] == model.cfg.sliding_window - 1 and sliding.compressed is None
    assert csa.compressed.shape[0] == 30 // 4 and csa.index_keys.shape[0] == 30 // 4
    assert csa.compressor.buffer_kv.shape[0] == 30 % 4 and csa.compressor.overlap_kv is not None
    assert hca.compressed.shape[0] == 30 // 8 and hca.compressor.buffer_kv.shape[0] == 30 % 8
