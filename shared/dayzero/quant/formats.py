"""Weight formats of the published checkpoints: MXFP4 experts and block-scaled FP8 dense weights.

MXFP4 (OCP Microscaling): E2M1 elements, two per byte (low nibble = even element), one
UE8M0 scale (2^(e-127), 0xFF = NaN) per 32 consecutive elements along the input dimension.
DeepSeek-V4 ships an expert weight [out, in] as int8 [out, in/2] with scales [out, in/32];
gpt-oss ships ``*_blocks [..., G, 16]`` with ``*_scales [..., G]`` (G = in/32).
FP8: e4m3 weights with one scale per 128 x 128 tile, the grid [ceil(out/128), ceil(in/128)]
(the last tiles may be partial).

Scales come as ``float8_e8m0fnu`` (the Instruct releases), ``uint8`` (the same bits) or
``float32`` (the Base releases). An E8M0 tensor is reinterpreted bit for bit, never converted
by value: ``.to()`` of 2^-7 through an integer dtype gives 0 and silently zeroes the experts.
"""

from __future__ import annotations

import functools
import math

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MX_BLOCK = 32
FP8_MAX = 448.0
FP8_BLOCK = (128, 128)
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32)


class FormatError(ValueError):
    """A tensor whose dtype or shape does not fit the declared format."""


def ue8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """uint8 (or float8_e8m0fnu) exponents -> fp32 powers of two; 0xFF -> NaN."""
    if scales.dtype != torch.uint8:
        scales = scales.view(torch.uint8)
    out = torch.exp2(scales.to(torch.float32) - 127.0)
    return torch.where(scales == 255, torch.full_like(out, float("nan")), out)


def ue8m0_bytes(scales: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """A checkpoint's MX scales as uint8 exponents (value 2^(byte-127)).

    float8_e8m0fnu: its bits; uint8: as is; float32: exact powers of two in [2^-127, 2^127]
    (anything else cannot be an E8M0 scale and is refused).
    """
    if scales.dtype == torch.uint8:
        return scales
    if scales.dtype == torch.float8_e8m0fnu:
        return scales.view(torch.uint8)
    if scales.dtype == torch.float32:
        mantissa, exponent = torch.frexp(scales)
        byte = exponent.to(torch.int32) + 126  # x = 0.5 * 2^exponent = 2^(byte - 127)
        bad = (mantissa != 0.5) | (byte < 0) | (byte > 254)
        if bad.any():
            value = scales[bad][0].item()
            raise FormatError(f"{name}: float32 MX scales must be powers of two in [2^-127, 2^127]; found {value}")
        return byte.to(torch.uint8)
    raise FormatError(f"{name}: scales must be float8_e8m0fnu, uint8 or float32; found {scales.dtype}")


def block_scales(scales: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """FP8 block scales as fp32 multipliers: E8M0 (float8_e8m0fnu / uint8) by their bits, float32 as is."""
    if scales.dtype == torch.float32:
        return scales
    return ue8m0_to_float(ue8m0_bytes(scales, name))


@functools.cache
def _byte_values(device: torch.device) -> torch.Tensor:
    """[256, 2] fp32: the two E2M1 values each byte packs (low nibble first)."""
    lut, byte = torch.tensor(E2M1_VALUES, dtype=torch.float32), torch.arange(256)
    return torch.stack((lut[byte & 0xF], lut[byte >> 4]), dim=-1).to(device)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] bytes -> [..., n] fp32 values (low nibble first): one row of a byte table per
    byte (a single gather; two nibble lookups and a stack took 8x as long on CPU)."""
    u8 = packed.contiguous().view(torch.uint8).flatten()
    pairs = _byte_values(packed.device).index_select(0, u8.to(torch.int32))
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
    return blocks.mul_(ue8m0_to_float(scales)[..., None]).view(values.shape)  # in place: no second buffer


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


def fp8_aligned(rows: int, cols: int, block: tuple[int, int] = FP8_BLOCK) -> bool:
    """Whether every FP8 block of a [rows, cols] weight is whole (or the axis is shorter than one block).

    transformers derives the block size from the scale grid (rows // grid rows), which agrees
    with the 128-block convention only for such shapes.
    """
    return all(n % min(b, n) == 0 for n, b in ((rows, block[0]), (cols, block[1])))


def quant_fp8(
    weight: torch.Tensor, ue8m0: bool, block: tuple[int, int] = FP8_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (float8_e4m3fn weight, scales [ceil(out/bm), ceil(in/bn)]: fp32, or uint8 UE8M0)."""
    rows, cols = weight.shape
    (gr, gc), (bm, bn) = fp8_grid(rows, cols, block), block
    padded = torch.zeros(gr * bm, gc * bn, dtype=torch.float32, device=weight.device)
    padded[:rows, :cols] = weight.float()
    tiles = padded.reshape(gr, bm, gc, bn)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=torch.finfo(torch.float32).tiny)
    scale = amax / FP8_MAX  # dequant multiplies by it
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).reshape(gr * bm, gc * bn)[:rows, :cols]
    stored = (torch.log2(scale) + 127).round().to(torch.uint8) if ue8m0 else scale
    return q.to(torch.float8_e4m3fn), stored


def fp8_grid(rows: int, cols: int, block: tuple[int, int] = FP8_BLOCK) -> tuple[int, int]:
    """The scale grid of a [rows, cols] FP8 weight: one scale per block, the last ones partial."""
    return math.ceil(rows / block[0]), math.ceil(cols / block[1])


def dequant_fp8(
    weight: torch.Tensor, scales: torch.Tensor, name: str = "tensor", block: tuple[int, int] = FP8_BLOCK
) -> torch.Tensor:
    """float8_e4m3fn [out, in] + scales [ceil(out/bm), ceil(in/bn)] (fp32 or UE8M0) -> fp32 [out, in]."""
    rows, cols = weight.shape
    if weight.dtype != torch.float8_e4m3fn:
        raise FormatError(f"{name}: FP8 weights must be float8_e4m3fn; found {weight.dtype}")
    grid = fp8_grid(rows, cols, block)
    if tuple(scales.shape) != grid:
        raise FormatError(
            f"{name}: a [{rows}, {cols}] FP8 weight in {block[0]}x{block[1]} blocks needs scales {list(grid)}; "
            f"found {list(scales.shape)}"
        )
    s = block_scales(scales, name)
    if not torch.isfinite(s).all() or (s <= 0).any():
        raise FormatError(f"{name}: FP8 block scales must be finite and positive")
    full = s.repeat_interleave(block[0], dim=0)[:rows].repeat_interleave(block[1], dim=1)[:, :cols]
    return weight.float() * full
