"""Speculative decoding with the MTP layer: every kind of attention state a rejected draft wrote
is rolled back."""

from __future__ import annotations

import pytest
import torch

from dayzero.kv.pools import KVPools, pools_for
from dayzero.model.forward import prefill
from dayzero.speculative import Speculation, speculative_step

from .speculative_cases import GREEDY, completion_of, first_right_drafts, oracle_drafts, prompts_of

STATE_TOL = 1e-5  # the same rows computed by the prefill and decode kernels: rounding-level
# Block sizes: the window ring holds the window's last 7 rows in whole blocks. On blocks of 16 it has
# 9 slots spare, so a slot a rejected draft wrote held a row no later step reads; on blocks of 7 none
# (DeepSeek's window of 128 on blocks of 16: one), so the rows it overwrote are read again.
BLOCK_SIZES = (16, 7)


def _live_state(pools: KVPools, seq: str) -> dict[str, torch.Tensor]:
    """What a sequence of length n is: the window rows of its last window - 1 positions (main
    layers) and of the MTP layer's (positions up to n - 2), the buffered compressor rows and CSA
    overlaps, every block of compressed entries and indexer keys (past the live entries they
    read zero in a fresh pool, so an entry a rejected draft emitted shows), the pending streams."""
    layout, seq_blocks = pools.layout, pools.sequences[seq]
    n, tables, bs = seq_blocks.length, seq_blocks.tables, layout.block_size
    capacity = len(tables["window"]) * bs

    def ring(layers: slice, positions: range) -> torch.Tensor:
        slots = [p % capacity for p in positions]
        return pools.window[layers, [tables["window"][s // bs] for s in slots], [s % bs for s in slots]]

    main, w = layout.num_layers, layout.sliding_window - 1
    state = {
        "length": torch.tensor(float(n)),
        "window": ring(slice(0, main), range(max(0, n - w), n)),
        "mtp_window": ring(slice(main, main + 1), range(max(0, n - 1 - w), n - 1)),
    }
    slot = tables["compressor"][0]
    for name, tensor in pools.compressor.items():
        rate = layout.hca_rate if name.startswith("hca") else layout.csa_rate
        if "overlap" in name:
            state[name] = tensor[:, slot] if n >= rate else tensor[:, slot, :0]
        else:
            state[name] = tensor[:, slot] if name == "mtp_hidden" else tensor[:, slot, : n % rate]
    state.update({pool: storage[:, tables[pool]] for pool, storage in pools.compressed.items()})
    return state


def _fresh_state(model, tokens: list[int], block_size: int) -> dict[str, torch.Tensor]:
    """The state of a sequence that only ever saw ``tokens``."""
    pools = pools_for(model.cfg, torch.float32, 64, block_size=block_size, mtp=True)
    prefill(model, pools, ["r"], [tokens])
    return _live_state(pools, "r")


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("first_right", [False, True])
def test_rejected_drafts_leave_no_state(mtp_model, plain_tokens, first_right, block_size):
    """After every step with rejected drafts (k = 2: both, or the second), each sequence's whole
    attention state (window rings of the main and MTP layers, compressor buffers and overlaps,
    compressed entries, indexer keys, pending streams, length, blocks) equals that of a sequence
    that never saw the drafts; steps cross the window and both compressors' boundaries, on a window
    ring with spare slots and on one without."""
    prompts, refs = prompts_of(mtp_model, 3), plain_tokens[8][:3]
    pools = pools_for(mtp_model.cfg, torch.float32, 64, max_sequences=3, block_size=block_size, mtp=True)
    propose = (
        first_right_drafts(refs, prompts, pools) if first_right else oracle_drafts(refs, prompts, pools, wrong=True)
    )
    ids = ["s0", "s1", "s2"]
    completions = [completion_of(p, GREEDY) for p in prompts]
    out = [[c.next(row).token] for c, row in zip(completions, prefill(mtp_model, pools, ids, prompts), strict=True)]
    used = pools.usage()
    for _ in range(10):
        outcomes = speculative_step(mtp_model, pools, ids, [o[-1] for o in out], completions, Speculation(2, propose))
        for i, outcome in enumerate(outcomes):
            out[i] += [s.token for s in outcome.steps]
            assert outcome.accepted == int(first_right)
            expected = _fresh_state(mtp_model, prompts[i] + out[i][:-1], block_size)
            got = _live_state(pools, ids[i])
            for name, value in expected.items():
                assert got[name].shape == value.shape, name
                assert torch.allclose(got[name], value, atol=STATE_TOL), name
        assert out == [r[: len(out[0])] for r in refs]
    pools.release("s0"), pools.release("s1"), pools.release("s2")
    assert all(n == 0 for n, _ in pools.usage().values()) and used
