"""The vision tower: a ViT with the weights and outputs of transformers' Qwen2.5-VL vision model.

Patch embedding (a linear map of each 3 x T x 14 x 14 patch), 2D rotary positions (height
and width halves of each head), blocks that attend within windows of merged patches
except the full-attention blocks, RMSNorm, gated SiLU MLP, and the 2x2 patch merger whose
output width is the language model's hidden size. Attention uses torch's fused
``scaled_dot_product_attention`` per image / window segment (a reasoned choice of an
existing fused op: segments are short and dense, with no sink or sparsity to add).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    in_channels: int = 3
    rope_theta: float = 10000.0

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> VisionConfig:
        """As transformers' Qwen2_5_VLVisionConfig reads it: ``rope_parameters.rope_theta``, else a
        top-level ``rope_theta`` (older configs), else 10000; an activation other than SiLU refused."""
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"vision_config.hidden_act={raw['hidden_act']!r}: only 'silu' is supported")
        rope = (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 10000.0))
        return VisionConfig(
            depth=int(raw["depth"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_heads=int(raw["num_heads"]),
            out_hidden_size=int(raw["out_hidden_size"]),
            patch_size=int(raw.get("patch_size", 14)),
            temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
            spatial_merge_size=int(raw.get("spatial_merge_size", 2)),
            window_size=int(raw.get("window_size", 112)),
            fullatt_block_indexes=tuple(raw.get("fullatt_block_indexes", (7, 15, 23, 31))),
            in_channels=int(raw.get("in_channels", 3)),
            rope_theta=float(rope),
        )


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias).requires_grad_(False)


class _Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)


class _PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.proj = nn.Module()
        shape = (cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj.weight = nn.Parameter(torch.empty(shape), requires_grad=False)


class _Attention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv, self.proj = _linear(dim, 3 * dim), _linear(dim, dim)


class _MLP(nn.Module):
    def __init__(self, dim: int, inter: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = _linear(dim, inter), _linear(dim, inter), _linear(inter, dim)


class _Block(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1, self.norm2 = _Norm(cfg.hidden_size), _Norm(cfg.hidden_size)
        self.attn, self.mlp = _Attention(cfg.hidden_size), _MLP(cfg.hidden_size, cfg.intermediate_size)


class _Merger(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        width = cfg.hidden_size * cfg.spatial_merge_size**2
        self.ln_q = _Norm(cfg.hidden_size)
        self.mlp = nn.ModuleList([_linear(width, width), nn.GELU(), _linear(width, cfg.out_hidden_size)])


class VisionTower(nn.Module):
    """Weights under the names of ``visual.*`` in Qwen2.5-VL checkpoints."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = _PatchEmbed(cfg)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.merger = _Merger(cfg)


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _positions(grid: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """(h, w) of every patch, laid out merge-block-major: [N, 2]."""
    out = []
    for t, h, w in grid:
        hpos, wpos = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        pos = torch.stack(
            [hpos.reshape(shape).transpose(1, 2).flatten(), wpos.reshape(shape).transpose(1, 2).flatten()], -1
        )
        out.append(pos.repeat(t, 1))
    return torch.cat(out)


def _windows(grid: list[tuple[int, int, int]], cfg: VisionConfig) -> tuple[torch.Tensor, list[int]]:
    """Order of merged patches that groups each window, and the window bounds (in patches)."""
    merge, unit = cfg.spatial_merge_size, cfg.spatial_merge_size**2
    size = cfg.window_size // merge // cfg.patch_size
    order, bounds, base = [], [0], 0
    for t, h, w in grid:
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).reshape(t, gh, gw)
        ph, pw = (size - gh % size) % size, (size - gw % size) % size
        padded = F.pad(index, (0, pw, 0, ph), value=-1)
        nh, nw = (gh + ph) // size, (gw + pw) // size
        tiles = padded.reshape(t, nh, size, nw, size).permute(0, 1, 3, 2, 4).reshape(t * nh * nw, size * size)
        for tile in tiles:
            kept = tile[tile >= 0]
            if kept.numel():
                order.append(kept + base)
                bounds.append(bounds[-1] + kept.numel() * unit)
        base += t * gh * gw
    return torch.cat(order), bounds


def _segments(bounds: list[int]) -> list[slice]:
    return [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


@torch.inference_mode()
def encode(tower: VisionTower, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """pixel_values [N, C*T*P*P], grid_thw [images, 3] -> merged embeddings [N / merge^2, out_hidden]."""
    cfg = tower.cfg
    grid = [tuple(int(v) for v in g) for g in grid_thw.tolist()]
    unit = cfg.spatial_merge_size**2
    weight = tower.patch_embed.proj.weight
    x = F.linear(pixel_values.to(weight.device, weight.dtype), weight.reshape(cfg.hidden_size, -1))  # [N, hidden]
    n, heads = x.shape[0], cfg.num_heads
    order, window_bounds = _windows(grid, cfg)
    patch_order = (order[:, None] * unit + torch.arange(unit)).flatten()
    x = x[patch_order.to(x.device)]
    head_dim = cfg.hidden_size // heads
    spatial = head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32) / spatial))
    angles = (_positions(grid, cfg.spatial_merge_size)[patch_order].float()[..., None] * inv_freq).flatten(1)
    angles = torch.cat((angles, angles), -1).to(x.device)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    full = [0]
    for t, h, w in grid:
        full += [full[-1] + h * w] * t
    for i, block in enumerate(tower.blocks):
        segments = _segments(full if i in cfg.fullatt_block_indexes else window_bounds)
        h = _rms(x, block.norm1.weight)
        q, k, v = block.attn.qkv(h).view(n, 3, heads, head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, N, head_dim]
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s]) for s in segments], dim=2)
        out = out[0].transpose(0, 1)
        x = x + block.attn.proj(out.reshape(n, -1))
        h = _rms(x, block.norm2.weight)
        x = x + block.mlp.down_proj(F.silu(block.mlp.gate_proj(h)) * block.mlp.up_proj(h))
    merged = _rms(x, tower.merger.ln_q.weight).view(-1, cfg.hidden_size * unit)
    for layer in tower.merger.mlp:
        merged = layer(merged)
    return merged[torch.argsort(order).to(merged.device)]
