"""A sequence's attention state: the four things that must move from prefill to decode.

Per layer:
  window      [n <= sliding_window - 1, head_dim]   raw KV (normed, roped) of the last tokens
  compressed  [N, head_dim]                         compressed KV entries (CSA / HCA layers)
  index_keys  [N, index_head_dim]                   lightning-indexer keys (CSA layers)
  compressor  running state of each compressor: projected tokens not yet folded into an
              entry (``buffer_*``, < rate rows) and, for overlapping (CSA) compressors, the
              previous window's first-series slice (``overlap_*``, rate rows).

Everything is a plain tensor so a state can be copied to another pool or process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import CSA, SLIDING, ModelConfig


@dataclass(slots=True)
class CompressorState:
    buffer_kv: torch.Tensor  # [r < rate, width]
    buffer_gate: torch.Tensor  # [r < rate, width] (position bias not yet added)
    overlap_kv: torch.Tensor | None = None  # [rate, dim], CSA only, after the first window
    overlap_gate: torch.Tensor | None = None  # [rate, dim], position bias included

    @staticmethod
    def empty(width: int, dtype: torch.dtype, device: torch.device) -> CompressorState:
        return CompressorState(torch.empty(0, width, dtype=dtype, device=device),
                               torch.empty(0, width, dtype=dtype, device=device))


@dataclass(slots=True)
class LayerState:
    window: torch.Tensor
    compressed: torch.Tensor | None = None
    index_keys: torch.Tensor | None = None
    compressor: CompressorState | None = None
    index_compressor: CompressorState | None = None


@dataclass(slots=True)
class SequenceState:
    """All attention state of one sequence; ``length`` tokens have been consumed."""

    layers: list[LayerState]
    length: int = 0

    @staticmethod
    def new(cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu") -> SequenceState:
        device = torch.device(device)
        layers = []
        for kind in cfg.layer_types:
            state = LayerState(window=torch.empty(0, cfg.head_dim, dtype=dtype, device=device))
            if kind != SLIDING:
                width = 2 * cfg.head_dim if kind == CSA else cfg.head_dim
                state.compressed = torch.empty(0, cfg.head_dim, dtype=dtype, device=device)
                state.compressor = CompressorState.empty(width, dtype, device)
            if kind == CSA:
                state.index_keys = torch.empty(0, cfg.index_head_dim, dtype=dtype, device=device)
                state.index_compressor = CompressorState.empty(2 * cfg.index_head_dim, dtype, device)
            layers.append(state)
        return SequenceState(layers)
