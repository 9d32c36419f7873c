"""Block pools for all attention state, with per-sequence block tables.

A sequence's state is fully described by its ``length`` and its block ids in each pool:
window entries = min(length, window - 1) (a ring, slot = position % capacity), compressed
entries = length // rate, buffered compressor rows = length % rate, and the CSA overlap
exists once length >= rate. With an MTP layer (speculative decoding) its window holds positions
0..length-2 and ``mtp_hidden`` the main model's streams at position length-1, which the MTP
layer consumes with the next token.

The forward writes a step's state; the runtime decides how much of it counts: ``reserve``
allocates, ``commit`` advances the length by the tokens kept, ``rollback`` returns the blocks a
reserve added that the committed length does not need (see ``kv.snapshot`` for the rows).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from array import array
from collections.abc import Callable
from types import MappingProxyType

import torch

from ..config import ModelConfig
from .blocks import BlockAllocator, OutOfBlocks, SequenceBlocks, take
from .layout import GROWING_POOLS, POOL_KINDS, PoolLayout
from .places import places_of

Allocate = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def zeros_on(device: torch.device | str) -> Allocate:
    return lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=device)


def _compressor_tensors(
    layout: PoolLayout, slots: int, allocate: Allocate
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One fp32 storage [1, slots, floats per slot], slot-major: a sequence's whole running state is
    one row, which a handoff copies at once; each named tensor [layers, slots, rows, width] is a
    view of it (``layout.compressor_shapes``)."""
    shapes = layout.compressor_shapes()
    storage = allocate((1, slots, sum(math.prod(shape) for shape in shapes.values())), torch.float32)
    views, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        views[name] = storage[0, :, offset : offset + size].view(slots, *shape).transpose(0, 1)
        offset += size
    return storage, views


def _bytes_per_sequence_and_token(layout: PoolLayout, dtype: torch.dtype) -> tuple[int, float]:
    """Bytes of one sequence's window and compressor slot; bytes a token adds to the growing pools."""
    elem = torch.finfo(dtype).bits // 8
    per_seq = layout.window_capacity * layout.row_bytes("window", elem) + layout.row_bytes("compressor", 4)
    return per_seq, sum(layout.row_bytes(p, elem) / layout.rate(p) for p in GROWING_POOLS)


class KVPools:
    """Storage and allocators of every pool; sequences are keyed by an id of the caller's."""

    def __init__(
        self,
        layout: PoolLayout,
        blocks: dict[str, int],
        dtype: torch.dtype,
        device="cpu",
        allocate: Allocate | None = None,
        pool_id: str | None = None,
    ) -> None:
        """``allocate(shape, dtype)`` provides storage (default: zeros on ``device``); tensors are
        requested in a fixed order, so the same sequence of calls maps a shared segment."""
        self.layout, self.dtype, self.device = layout, dtype, torch.device(device)
        self.blocks = dict(blocks)
        self.pool_id = pool_id or uuid.uuid4().hex
        provide, order = allocate or zeros_on(self.device), []

        def allocate(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            order.append([shape[0], *shape[2:], str(dtype)])  # dim 1 counts blocks: sizes may differ
            return provide(shape, dtype)

        bs = layout.block_size

        def storage(layers: int, n: int, width: int) -> torch.Tensor:
            return allocate((layers, n, bs, width), dtype)

        window = storage(layout.window_layers, blocks["window"], layout.head_dim)
        compressed = {
            "compressed_csa": storage(len(layout.csa_layers), blocks["compressed_csa"], layout.head_dim),
            "compressed_hca": storage(len(layout.hca_layers), blocks["compressed_hca"], layout.head_dim),
            "index_keys": storage(len(layout.csa_layers), blocks["index_keys"], layout.index_head_dim),
        }
        compressor_storage, self.compressor = _compressor_tensors(layout, blocks["compressor"], allocate)
        # the storage, set for life (read-only: host_places holds its addresses, a tensor put in its
        # place would leave them to freed memory)
        self._storage = (window, *compressed.values(), compressor_storage)
        self._compressed = MappingProxyType(compressed)
        self._states: dict[tuple[str, int], tuple[torch.Tensor, ...]] = {}  # compressor_state's views
        # what a handoff must agree on: the layout and the order and shapes the storage is carved in
        order += [[name, t.shape[0], *t.shape[2:]] for name, t in self.compressor.items()]  # a slot's carving
        self.layout_hash = hashlib.sha256(json.dumps([layout.hash(), order]).encode()).hexdigest()[:16]
        self.allocators = {kind: BlockAllocator(blocks[kind]) for kind in POOL_KINDS}
        self.sequences: dict[str, SequenceBlocks] = {}
        self._capacity = layout.longest_held({k: a.total for k, a in self.allocators.items()})
        # bytes of one block (all layers) of each pool, in POOL_KINDS order
        self._block_bytes = [t.shape[0] * math.prod(t.shape[2:]) * t.element_size() for t in self.tensors()]
        # where host pools' storage lies (host_copy's places): a handoff copies between them in one
        # compiled call, without torch's or numpy's per-operation cost (most of a small state's copy)
        on_host = self.window.device.type == "cpu"  # (sizing pools are carved on the meta device)
        self.host_places = places_of(self.tensors()) if on_host else None

    @classmethod
    def from_budget(
        cls, layout: PoolLayout, budget_bytes: int, max_sequences: int, dtype: torch.dtype, device="cpu"
    ) -> KVPools:
        """Window and compressor pools for ``max_sequences``; the rest of the budget to the growing pools."""
        per_seq, per_token = _bytes_per_sequence_and_token(layout, dtype)
        growing = budget_bytes - max_sequences * per_seq
        if growing <= 0:
            raise ValueError(f"attention-state budget {budget_bytes} B cannot hold {max_sequences} sequences")
        tokens = growing / per_token if per_token else 0
        blocks = {"window": max_sequences * layout.window_blocks, "compressor": max_sequences}
        for pool in GROWING_POOLS:
            blocks[pool] = math.ceil(tokens / layout.rate(pool) / layout.block_size)
        return cls(layout, blocks, dtype, device)

    @staticmethod
    def least_budget(layout: PoolLayout, max_tokens: int, max_sequences: int, dtype: torch.dtype) -> int:
        """The least budget ``from_budget`` turns into pools of ``max_sequences`` windows and one
        sequence of ``max_tokens`` (a growing pool of ``ceil(tokens / rate / block_size)`` blocks)."""
        per_seq, per_token = _bytes_per_sequence_and_token(layout, dtype)
        return max_sequences * per_seq + max(1, math.ceil(max_tokens * per_token))

    @classmethod
    def sized(
        cls, layout: PoolLayout, max_tokens: int, max_sequences: int, dtype: torch.dtype, device="cpu"
    ) -> KVPools:
        """Exactly enough blocks for ``max_sequences`` sequences of ``max_tokens`` tokens."""
        blocks = {kind: max_sequences * layout.blocks_for(kind, max_tokens) for kind in POOL_KINDS}
        return cls(layout, blocks, dtype, device)

    # -- sequences ---------------------------------------------------------------------------------

    def capacity_tokens(self) -> int:
        """Longest sequence the growing pools could ever hold."""
        return self._capacity

    def missing_blocks(self, seq_id: str | None, total_tokens: int) -> dict[str, int]:
        return self._missing(self.sequences.get(seq_id), total_tokens)

    def _missing(self, seq: SequenceBlocks | None, total_tokens: int) -> dict[str, int]:
        wanted = self.layout.blocks_of(total_tokens)
        return wanted if seq is None else {k: max(0, n - len(seq.tables[k])) for k, n in wanted.items()}

    def fits(self, total_tokens: int, seq_id: str | None = None) -> bool:
        """Whether a (new or existing) sequence can grow to ``total_tokens`` now."""
        return self._free_for(self.missing_blocks(seq_id, total_tokens))

    def _free_for(self, need: dict[str, int]) -> bool:
        allocators = self.allocators
        return all([allocators[k].free >= n for k, n in need.items()])  # (a list: no generator to start)

    def reserve(self, seq_id: str, total_tokens: int) -> dict[str, array]:
        """Allocate what ``seq_id`` needs to hold ``total_tokens``; all or nothing. -> the blocks added."""
        if total_tokens > self._capacity:
            raise OutOfBlocks(
                f"{total_tokens} tokens exceed the attention-state capacity of {self._capacity}",
                permanent=True,
            )
        seq = self.sequences.get(seq_id)
        if seq is not None and total_tokens <= seq.room:
            return {}  # (most decode steps)
        added = take(self.allocators, self._missing(seq, total_tokens), total_tokens)
        if seq is None:  # (its tables copies of the blocks added: those are the caller's)
            tables = {kind: blocks[:] for kind, blocks in added.items()}
            seq = self.sequences[seq_id] = SequenceBlocks(tables=tables)
        else:
            for kind, blocks in added.items():
                seq.tables[kind] += blocks
        self._measure(seq)
        return added

    def hold(self, seq_id: str, length: int, counts: dict[str, int]) -> SequenceBlocks:
        """``seq_id`` holds a state of ``length`` tokens (an import; ``counts``: ``layout.blocks_of(length)``):
        one held already reserves as ``reserve`` does, a new one takes ``counts`` blocks as its tables."""
        seq = self.sequences.get(seq_id)
        if seq is None and length <= self._capacity:
            tables = take(self.allocators, counts, length)
            seq = self.sequences[seq_id] = SequenceBlocks(tables=tables, room=self.layout.longest_held(counts))
        else:  # (longer than the pools hold: reserve's permanent OutOfBlocks)
            self.reserve(seq_id, length)
            seq = self.sequences[seq_id]
        seq.length = length
        return seq

    def _measure(self, seq: SequenceBlocks) -> None:
        tables = seq.tables
        seq.room = self.layout.longest_held({pool: len(tables[pool]) for pool in GROWING_POOLS})

    def commit(self, seq_id: str, n: int) -> None:
        """The step's first ``n`` tokens of ``seq_id`` are kept: its length grows by ``n``."""
        self.sequences[seq_id].length += n

    def rollback(self, seq_id: str, added: dict[str, array]) -> None:
        """Return the blocks of ``added`` (what a ``reserve`` allocated) that the committed length
        does not need; blocks reserved earlier stay."""
        seq = self.sequences[seq_id]
        kept = self.layout.blocks_of(seq.length)
        for kind, blocks in added.items():
            table = seq.tables[kind]
            spare = min(len(blocks), len(table) - kept[kind])
            if spare > 0:
                self.allocators[kind].release(table[-spare:])
                del table[-spare:]
        self._measure(seq)

    def compressor_state(self, kind: str, index: int) -> tuple[torch.Tensor, ...]:
        """The running state of compressor ``kind`` ("csa", "index", "hca") of its ``index``-th layer:
        (kv, gate), then (overlap_kv, overlap_gate) where it overlaps (csa, index); [slots, rate, width].
        Views into storage the pools keep for life, made once (each a select: ~18 aten ops a demo decode step)."""
        views = self._states.get((kind, index))
        if views is None:
            overlaps = f"{kind}_overlap_kv" in self.compressor
            parts = ("kv", "gate", "overlap_kv", "overlap_gate") if overlaps else ("kv", "gate")
            views = self._states[kind, index] = tuple(self.compressor[f"{kind}_{part}"][index] for part in parts)
        return views

    def hidden(self, seq_ids: list[str], dtype: torch.dtype) -> torch.Tensor:
        """The streams each sequence's MTP layer has yet to consume [B, hc_mult, hidden]."""
        slots = [self.sequences[s].tables["compressor"][0] for s in seq_ids]
        return self.compressor["mtp_hidden"][0, slots].to(dtype)

    def keep_hidden(self, seq_ids: list[str], streams: torch.Tensor) -> None:
        """Store ``streams`` [B, hc_mult, hidden] as each sequence's pending MTP input."""
        slots = [self.sequences[s].tables["compressor"][0] for s in seq_ids]
        self.compressor["mtp_hidden"][0, slots] = streams.float()

    def release(self, seq_id: str) -> None:
        seq = self.sequences.pop(seq_id, None)
        if seq is not None:
            for kind, blocks in seq.tables.items():
                self.allocators[kind].release(blocks)

    def length(self, seq_id: str) -> int:
        return self.sequences[seq_id].length

    def usage(self) -> dict[str, tuple[int, int]]:
        """(blocks used, blocks total) per pool."""
        return {k: (a.total - a.free, a.total) for k, a in self.allocators.items()}

    def sequence_bytes(self, seq_id: str) -> int:
        """Bytes of one sequence's state: its blocks in every pool and its compressor slot (counted,
        not gathered: decode counts every state it imports)."""
        tables = self.sequences[seq_id].tables
        return sum(len(tables[kind]) * size for kind, size in zip(POOL_KINDS, self._block_bytes, strict=True))

    def storage_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    @property
    def window(self) -> torch.Tensor:
        return self._storage[0]

    @property
    def compressed(self) -> MappingProxyType[str, torch.Tensor]:
        return self._compressed

    @property
    def compressor_storage(self) -> torch.Tensor:
        return self._storage[-1]

    def tensors(self) -> list[torch.Tensor]:
        return list(self._storage)


def pools_for(
    cfg: ModelConfig,
    dtype: torch.dtype,
    max_tokens: int,
    max_sequences: int = 1,
    block_size: int = 16,
    device="cpu",
    mtp: bool = False,
) -> KVPools:
    """Pools for a model, sized for ``max_sequences`` sequences of up to ``max_tokens`` tokens
    (``mtp``: with the MTP layer's state, for speculative decoding)."""
    layout = PoolLayout.of(cfg, block_size, str(dtype).removeprefix("torch."), mtp)
    return KVPools.sized(layout, max_tokens, max_sequences, dtype, device)
