"""Weight formats of the published checkpoints: MXFP4 experts and block-scaled FP8 dense weights.

MXFP4 (OCP Microscaling): E2M1 elements, two per byte (low nibble = even element), one
UE8M0 scale (2^(e-127), 0xFF = NaN) per 32 consecutive elements along the input dimension.
DeepSeek-V4 ships an expert weight [out, in] as int8 [out, in/2] with uint8 scales [out, in/32];
gpt-oss ships ``*_blocks [..., G, 16]`` with ``*_scales [..., G]`` (G = in/32).
FP8: e4m3 weights with one scale per (block_m x block_n) tile, fp32 or UE8M0; the block
size is derived from the scale grid (rows // scale_rows, cols // scale_cols).
"""

from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MX_BLOCK = 32
FP8_MAX = 448.0


class FormatError(ValueError):
    """A tensor whose dtype or shape does not fit the declared format."""


def ue8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """uint8 (or float8_e8m0fnu) exponents -> fp32 powers of two; 0xFF -> NaN."""
    if scales.dtype != torch.uint8:
        scales = scales.view(torch.uint8)
    out = torch.exp2(scales.to(torch.float32) - 127.0)
    return torch.where(scales == 255, torch.full_like(out, float("nan")), out)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] bytes -> [..., n] fp32 values (low nibble first)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    u8 = packed.contiguous().view(torch.uint8)
    pairs = torch.stack((lut[(u8 & 0xF).long()], lut[(u8 >> 4).long()]), dim=-1)
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """packed [..., out, in/2] int8/uint8, scales [..., out, in/32] -> fp32 [..., out, in]."""
    if packed.dtype not in (torch.int8, torch.uint8) or scales.shape[:-1] != packed.shape[:-1]:
        raise FormatError(
            f"{name}: MXFP4 needs int8/uint8 packed data and scales [..., in/32]; "
            f"got {packed.dtype} {tuple(packed.shape)} with scales {tuple(scales.shape)}"
        )
    values = unpack_e2m1(packed)
    if values.shape[-1] != scales.shape[-1] * MX_BLOCK:
        raise FormatError(f"{name}: {values.shape[-1]} values per row but {scales.shape[-1]} scales of 32")
    blocks = values.view(*values.shape[:-1], scales.shape[-1], MX_BLOCK)
    return (blocks * ue8m0_to_float(scales)[..., None]).view(values.shape)


def dequant_gpt_oss(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """gpt-oss ``*_blocks [..., G, 16]`` + ``*_scales [..., G]`` -> fp32 [..., G * 32]."""
    return dequant_mxfp4(blocks.flatten(-2), scales)


def _e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 of the E2M1 values nearest to ``x`` (already divided by its scale)."""
    magnitudes = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=x.device)
    code = (x.abs()[..., None] - magnitudes).abs().argmin(dim=-1)
    return code + 8 * (x < 0)


def quant_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., out, in] float -> (int8 [..., out, in/2], uint8 scales [..., out, in/32]).

    Scale = the smallest power of two with max|block| / scale <= 6; elements round to the
    nearest E2M1 value.
    """
    if weight.shape[-1] % MX_BLOCK:
        raise FormatError(f"MXFP4 needs the input dimension divisible by 32, got {weight.shape[-1]}")
    blocks = weight.float().reshape(*weight.shape[:-1], -1, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1).clamp(min=torch.finfo(torch.float32).tiny)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    codes = _e2m1_round(blocks / torch.exp2(exponent)[..., None]).reshape(weight.shape).to(torch.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).view(torch.int8)
    return packed, (exponent + 127).to(torch.uint8)


def fp8_block(rows: int, cols: int, block: int = 128) -> tuple[int, int] | None:
    """The tile of a [rows, cols] weight (whole axis when shorter than ``block``), or None."""
    bm, bn = min(block, rows), min(block, cols)
    return (bm, bn) if rows % bm == 0 and cols % bn == 0 else None


def quant_fp8(weight: torch.Tensor, tile: tuple[int, int], ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (float8_e4m3fn weight, scales [out/bm, in/bn]: fp32, or uint8 UE8M0)."""
    rows, cols = weight.shape
    bm, bn = tile
    tiles = weight.float().reshape(rows // bm, bm, cols // bn, bn)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=torch.finfo(torch.float32).tiny)
    scale = amax / FP8_MAX  # dequant multiplies by it
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).reshape(rows, cols).to(torch.float8_e4m3fn)
    stored = (torch.log2(scale) + 127).round().to(torch.uint8) if ue8m0 else scale
    return q, stored


def dequant_fp8(weight: torch.Tensor, scales: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """float8_e4m3fn [out, in] + scales [sr, sc] (fp32 or UE8M0) -> fp32 [out, in]."""
    rows, cols = weight.shape
    sr, sc = scales.shape
    if weight.dtype != torch.float8_e4m3fn or rows % sr or cols % sc:
        raise FormatError(
            f"{name}: FP8 needs float8_e4m3fn data and a scale grid dividing it; "
            f"got {weight.dtype} {tuple(weight.shape)} with scales {tuple(scales.shape)}"
        )
    s = ue8m0_to_float(scales) if scales.dtype in (torch.uint8,) or "e8m0" in str(scales.dtype) else scales.float()
    tiles = weight.float().reshape(sr, rows // sr, sc, cols // sc)
    return (tiles * s[:, None, :, None]).reshape(rows, cols)
