"""Shapes of the attention-state pools, derived from the model config and a block size.

Pools (one per kind of state; compressed entries split by rate since they grow differently):
  window          [layers (+1 MTP), blocks, block_size, head_dim]  ring of the last raw KV rows
  compressed_csa  [csa_layers, blocks, block_size, head_dim] CSA compressed entries
  compressed_hca  [hca_layers, blocks, block_size, head_dim] HCA compressed entries
  index_keys      [csa_layers, blocks, block_size, index_head_dim]
  compressor      per-sequence slots holding each compressor's running state
                  (buffered rows; CSA: the previous window's first series; with an MTP
                  layer, the last position's hyper-connection streams it has not consumed yet)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

from ..config import CSA, HCA, SLIDING, ModelConfig

GROWING_POOLS = ("compressed_csa", "compressed_hca", "index_keys")
POOL_KINDS = ("window", *GROWING_POOLS, "compressor")


@dataclass(frozen=True, slots=True)
class PoolLayout:
    block_size: int
    num_layers: int
    head_dim: int
    index_head_dim: int
    sliding_window: int
    csa_layers: tuple[int, ...]
    hca_layers: tuple[int, ...]
    csa_rate: int
    hca_rate: int
    dtype: str
    # multi-token prediction: the MTP layer's window (layer index num_layers) and pending streams
    mtp_layers: int = 0
    hc_mult: int = 0
    hidden_size: int = 0

    @staticmethod
    def of(cfg: ModelConfig, block_size: int, dtype: str, mtp: bool = False) -> PoolLayout:
        """``mtp``: also hold the state of speculative decoding's MTP layer (sliding attention only)."""
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if mtp and cfg.mtp_layer_type != SLIDING:
            raise ValueError(f"speculative decoding needs a sliding-attention MTP layer, not {cfg.mtp_layer_type}")
        return PoolLayout(
            block_size=block_size,
            num_layers=cfg.num_layers,
            head_dim=cfg.head_dim,
            index_head_dim=cfg.index_head_dim,
            sliding_window=cfg.sliding_window,
            csa_layers=tuple(i for i, t in enumerate(cfg.layer_types) if t == CSA),
            hca_layers=tuple(i for i, t in enumerate(cfg.layer_types) if t == HCA),
            csa_rate=cfg.compress_rates[CSA],
            hca_rate=cfg.compress_rates[HCA],
            dtype=dtype,
            mtp_layers=int(mtp),
            hc_mult=cfg.hc_mult if mtp else 0,
            hidden_size=cfg.hidden_size if mtp else 0,
        )

    @property
    def window_layers(self) -> int:
        """Layers with a window ring: the main layers, then the MTP layer's."""
        return self.num_layers + self.mtp_layers

    @property
    def window_blocks(self) -> int:
        """Blocks per sequence in the window ring (holds at least sliding_window - 1 rows)."""
        return max(1, -(-(self.sliding_window - 1) // self.block_size))

    @property
    def window_capacity(self) -> int:
        return self.window_blocks * self.block_size

    def rate(self, pool: str) -> int:
        return self.hca_rate if pool == "compressed_hca" else self.csa_rate

    def entries(self, pool: str, length: int) -> int:
        """Compressed entries a sequence of ``length`` tokens holds in a growing pool."""
        layers = self.hca_layers if pool == "compressed_hca" else self.csa_layers
        return length // self.rate(pool) if layers else 0

    def blocks_for(self, pool: str, length: int) -> int:
        return self.blocks_of(length)[pool]

    def blocks_of(self, length: int) -> dict[str, int]:
        """Blocks a sequence of ``length`` tokens holds in each pool (in one pass: every decode
        step reserves each sequence's blocks)."""
        csa, hca, size = bool(self.csa_layers), bool(self.hca_layers), self.block_size
        csa_blocks = -(-(length // self.csa_rate) // size) if csa else 0
        return {
            "window": self.window_blocks,
            "compressed_csa": csa_blocks,
            "compressed_hca": -(-(length // self.hca_rate) // size) if hca else 0,
            "index_keys": csa_blocks,  # one indexer key per CSA entry
            "compressor": int(csa or hca or bool(self.mtp_layers)),
        }

    def longest_held(self, blocks: dict[str, int]) -> int:
        """The longest sequence ``blocks`` (per growing pool) hold: its entries (length // rate)
        must fit in them; the window and compressor pools hold any length."""
        held, size = 1 << 62, self.block_size  # (every import measures its sequence: no list, no min of one)
        if self.csa_layers:
            held = (min(blocks["compressed_csa"], blocks["index_keys"]) * size + 1) * self.csa_rate - 1
        if self.hca_layers:
            held = min(held, (blocks["compressed_hca"] * size + 1) * self.hca_rate - 1)
        return held

    def row_bytes(self, pool: str, elem: int) -> int:
        """Bytes of one block-row (all layers) in a pool, or of one compressor slot."""
        if pool == "window":
            return self.window_layers * self.head_dim * elem
        if pool == "index_keys":
            return len(self.csa_layers) * self.index_head_dim * elem
        if pool in GROWING_POOLS:
            layers = self.hca_layers if pool == "compressed_hca" else self.csa_layers
            return len(layers) * self.head_dim * elem
        return sum(math.prod(shape) for shape in self.compressor_shapes().values()) * elem

    def compressor_shapes(self) -> dict[str, tuple[int, int, int]]:
        """[layers, rows, width] of each compressor's running state in one compressor slot, in the
        order the slot is carved: CSA buffer kv+gate (two series) and overlap kv+gate (one series),
        the same for the indexer's compressor, HCA buffer kv+gate; fp32 (the reference adds the fp32
        position bias before keeping the overlap); rows past ``length % rate`` are stale."""
        d, di, csa, hca = self.head_dim, self.index_head_dim, len(self.csa_layers), len(self.hca_layers)
        r, rh = self.csa_rate, self.hca_rate
        shapes = {
            "csa_kv": (csa, r, 2 * d),
            "csa_gate": (csa, r, 2 * d),
            "csa_overlap_kv": (csa, r, d),
            "csa_overlap_gate": (csa, r, d),
            "index_kv": (csa, r, 2 * di),
            "index_gate": (csa, r, 2 * di),
            "index_overlap_kv": (csa, r, di),
            "index_overlap_gate": (csa, r, di),
            "hca_kv": (hca, rh, d),
            "hca_gate": (hca, rh, d),
        }
        if self.mtp_layers:  # the streams at the last position, not yet fed to the MTP layer
            shapes["mtp_hidden"] = (self.mtp_layers, self.hc_mult, self.hidden_size)
        return shapes

    def hash(self) -> str:
        """Identifies the memory layout: a handoff between different layouts is refused."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]
