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
    ue8m0_bytes,
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
        q, s = quant_fp8(w, ue8m0, block=(32, 128))
        assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 2)
        assert (dequant_fp8(q, s, block=(32, 128)) - w).abs().max() < 0.07 * w.abs().max()


def test_e8m0_scales_are_read_by_their_bits_in_every_stored_dtype():
    # 2^-7 is the byte 120; as float8_e8m0fnu, a value conversion (.to(uint8)) would give 0
    e8m0 = torch.tensor([120, 127, 130], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    assert e8m0.to(torch.uint8).tolist() == [0, 1, 8]  # the trap: converting by value
    assert ue8m0_bytes(e8m0).tolist() == [120, 127, 130]
    assert ue8m0_bytes(torch.tensor([120, 127, 130], dtype=torch.uint8)).tolist() == [120, 127, 130]
    assert ue8m0_bytes(torch.tensor([2.0**-7, 1.0, 8.0, 2.0**-127])).tolist() == [120, 127, 130, 0]
    with pytest.raises(FormatError, match="powers of two.*0.3"):
        ue8m0_bytes(torch.tensor([1.0, 0.3]), "layers.1.ffn.experts.0.w1.scale")
    with pytest.raises(FormatError, match="float8_e8m0fnu, uint8 or float32; found torch.bfloat16"):
        ue8m0_bytes(torch.ones(2, dtype=torch.bfloat16))
    # one 1.0 E2M1 pair with scale 2^-7 decodes to 2^-7 from either spelling of the scale
    pair = torch.full((1, 16), 0x22, dtype=torch.uint8)
    assert dequant_mxfp4(pair, ue8m0_bytes(e8m0[:1].reshape(1, 1))).eq(2.0**-7).all()


def test_fp8_partial_blocks_follow_the_ceil_grid():
    # [200, 130] in 128x128 blocks: a 2x2 grid whose last row and column of blocks are partial
    w = torch.arange(200 * 130, dtype=torch.float32).reshape(200, 130) % 7 - 3  # exact in e4m3
    scales = torch.tensor([[1.0, 2.0], [4.0, 0.5]])
    out = dequant_fp8(w.to(torch.float8_e4m3fn), scales)
    assert torch.equal(out[:128, :128], w[:128, :128]) and torch.equal(out[:128, 128:], 2 * w[:128, 128:])
    assert torch.equal(out[128:, :128], 4 * w[128:, :128]) and torch.equal(out[128:, 128:], 0.5 * w[128:, 128:])
    e8m0 = torch.tensor([[127, 128], [129, 126]], dtype=torch.uint8)  # the same scales as E8M0 bytes
    assert torch.equal(dequant_fp8(w.to(torch.float8_e4m3fn), e8m0.view(torch.float8_e8m0fnu)), out)
    with pytest.raises(FormatError, match=r"needs scales \[2, 2\]; found \[1, 2\]"):
        dequant_fp8(w.to(torch.float8_e4m3fn), scales[:1])
    q, s = quant_fp8(torch.randn(200, 130), ue8m0=True)
    assert s.shape == (2, 2) and q.shape == (200, 130)


def test_unsupported_formats_are_named():
    with pytest.raises(FormatError, match="layers.0.ffn.experts.1.w1.weight: MXFP4"):
        dequant_mxfp4(torch.zeros(4, 8), torch.zeros(4, 1, dtype=torch.uint8), "layers.0.ffn.experts.1.w1.weight")
    with pytest.raises(FormatError, match="wq_a: FP8 weights must be float8_e4m3fn"):
        dequant_fp8(torch.zeros(4, 8), torch.ones(1, 1), "wq_a")
    with pytest.raises(FormatError, match="divisible by 32"):
        quant_mxfp4(torch.zeros(2, 40))
