"""MXFP4 and FP8 decoding against hand-computed values and transformers' own unpacking."""

from __future__ import annotations

import pytest
import torch

from dayzero.quant.formats import (
    FormatError,
    dequant_fp8,
    dequant_gpt_oss,
    dequant_mxfp4,
    quant_fp8,
    quant_mxfp4,
    ue8m0_to_float,
    unpack_e2m1,
)


def test_e2m1_codes_and_nibble_order_by_hand():
    # byte 0x21: low nibble 1 (0.5) is the even element, high nibble 2 (1.0) the odd one
    # byte 0xF9: low 9 (-0.5), high 15 (-6.0)
    packed = torch.tensor([[0x21, 0xF9]], dtype=torch.uint8)
    assert unpack_e2m1(packed).tolist() == [[0.5, 1.0, -0.5, -6.0]]
    assert ue8m0_to_float(torch.tensor([127, 128, 125, 255], dtype=torch.uint8)).tolist()[:3] == [1.0, 2.0, 0.25]
    assert torch.isnan(ue8m0_to_float(torch.tensor([255], dtype=torch.uint8)))[0]


def test_mxfp4_scales_apply_per_32_values():
    packed = torch.full((1, 32), 0x22, dtype=torch.uint8)  # 64 values of 1.0
    scales = torch.tensor([[128, 126]], dtype=torch.uint8)  # 2.0 for the first 32, 0.5 for the next
    out = dequant_mxfp4(packed, scales)
    assert out[0, :32].eq(2.0).all() and out[0, 32:].eq(0.5).all()


def test_quantize_round_trip_is_exact_on_representable_values():
    w = torch.randn(6, 64)
    packed, scales = quant_mxfp4(w)
    once = dequant_mxfp4(packed, scales)
    assert torch.equal(dequant_mxfp4(*quant_mxfp4(once)), once)
    assert (once - w).abs().max() <= w.abs().max() / 3  # coarse, as four bits are


def test_gpt_oss_blocks_match_transformers_unpacking():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (2, 6, 4, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(118, 136, (2, 6, 4), dtype=torch.uint8, generator=gen)
    ours = dequant_gpt_oss(blocks, scales)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    # transformers returns the gpt-oss forward layout [E, in, out]; ours is the stored [E, out, in]
    assert theirs.shape == (2, 128, 6) and torch.equal(ours.transpose(-1, -2), theirs)


def test_fp8_block_scales_fp32_and_ue8m0():
    w = torch.randn(64, 256)
    for ue8m0 in (False, True):
        q, s = quant_fp8(w, (32, 128), ue8m0)
        assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 2)
        assert (dequant_fp8(q, s) - w).abs().max() < 0.07 * w.abs().max()


def test_unsupported_formats_are_named():
    with pytest.raises(FormatError, match="layers.0.ffn.experts.1.w1.weight: MXFP4"):
        dequant_mxfp4(torch.zeros(4, 8), torch.zeros(4, 1, dtype=torch.uint8), "layers.0.ffn.experts.1.w1.weight")
    with pytest.raises(FormatError, match="wq_a.*FP8"):
        dequant_fp8(torch.zeros(4, 8), torch.ones(1, 1), "wq_a")
    with pytest.raises(FormatError, match="divisible by 32"):
        quant_mxfp4(torch.zeros(2, 40))
