"""Per-step batch metadata, built once and passed to every layer (plan, then run)."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import ModelConfig, RopeConfig
from ..kernels import Backend, DecodeWindow, RaggedBatch, sparse_attention_decode, sparse_attention_prefill
from ..kernels.attention_torch import FEW_ROWS
from ..kernels.batch import from_host
from ..kv.layout import GROWING_POOLS
from ..kv.pools import KVPools
from .rope import RopeTable, cos_sin, inv_freq

if TYPE_CHECKING:
    from ..settings import Settings


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    backend: Backend = "torch"
    sparse: bool = True  # CSA layers attend to the indexer's top-k; False: to every causal entry

    @classmethod
    def of(cls, settings: Settings) -> AttentionOptions:
        """DAYZERO_ATTENTION_BACKEND and DAYZERO_SPARSE_ATTENTION."""
        return cls(settings.attention_backend, settings.sparse_attention)


@lru_cache(maxsize=16)
def _freqs(rope: RopeConfig, dim: int, device: torch.device) -> torch.Tensor:
    return inv_freq(rope, dim).to(device)


@dataclass(frozen=True, slots=True)
class Closing:
    """The tokens of a column that close a window of a compress rate: their compressor slots (long)
    and whether an earlier window precedes theirs (bool)."""

    slots: torch.Tensor
    has_prev: torch.Tensor


@dataclass(frozen=True, slots=True)
class Column:
    """Every sequence's j-th new token in a step of a few per sequence (``FEW_ROWS`` at most; decode:
    one column of every sequence), for the compressors' fold: its packed rows (None: every row, in
    order), its compressor slots (long), and per compress rate r the row of its window each fills
    (position % r, long) and the tokens that close one (None: no token does)."""

    rows: torch.Tensor | None
    slots: torch.Tensor
    window_rows: dict[int, torch.Tensor]
    closing: dict[int, Closing | None]


@dataclass(frozen=True, slots=True)
class Closed:
    """The windows a step of columns closes at one compress rate, column by column: each one's
    sequence and entry index (long), and cos / sin at the entry's position (entry * rate)."""

    seqs: torch.Tensor
    entries: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass(frozen=True, slots=True)
class Bucket:
    """The fixed shape of a decode step, for capture in a CUDA graph: ``seqs`` rows (the step's
    sequences, then padding rows), block tables wide enough for ``tokens`` tokens, and every
    kernel sized for sequences of up to ``tokens`` (bounds, not the step's own lengths). ``pad``:
    a sequence of the pools (a block of every pool reserved: the longest compress rate's tokens)
    that the padding rows, and the compressors' windows no token closes, write to: a step of a
    bucket has the same ops, shapes and host values whatever its sequences, only the contents of
    its tensors differ (Triton backend)."""

    seqs: int
    tokens: int
    pad: str

    @staticmethod
    def fitting(n_seqs: int, tokens: int, pad: str, least_tokens: int = 1024) -> Bucket:
        """The smallest power-of-two bucket holding ``n_seqs`` sequences of up to ``tokens``."""
        return Bucket(1 << (n_seqs - 1).bit_length(), max(least_tokens, 1 << (tokens - 1).bit_length()), pad)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Packed tokens of several sequences (``batch``) and where their state lives.

    token_ids [T]; rope_* cos/sin at the token positions; freqs_compress [rope_dim/2]
    for compressed-entry positions; window_table [B, wb] and tables[pool] [B, max blocks]
    int32 block tables; slots [B] compressor-state slot of each sequence; per compress rate r:
    visible[r] [T] entries each token sees ((position + 1) // r), at most ``longest[r]`` (host);
    columns: a step of a few tokens per sequence by column (``Column``; empty for longer steps),
    and ``closed[r]`` the windows they close (None: none). A plan of a ``Bucket`` has padding rows
    after the sequences, a last row in the growing pools' tables for the pad sequence, and every
    row in ``closed`` (those closing no window write to the pad sequence).
    """

    token_ids: torch.Tensor
    batch: RaggedBatch
    rope_main: RopeTable
    rope_compress: RopeTable
    freqs_compress: torch.Tensor
    window_table: torch.Tensor
    tables: dict[str, torch.Tensor]
    slots: tuple[int, ...]
    options: AttentionOptions
    attend: Callable[..., torch.Tensor]  # the prefill or the decode variant of sparse attention
    visible: dict[int, torch.Tensor]
    longest: dict[int, int]
    columns: tuple[Column, ...]
    closed: dict[int, Closed | None]
    ring: DecodeWindow | None = None  # the window's metadata for every layer (torch backend, a few rows per sequence)

    def last_rows(self) -> list[int]:
        return [r + n - 1 for r, n in zip(self.batch.row0s, self.batch.news, strict=True)]


def _host_table(blocks: list[array], width: int = 0) -> np.ndarray:
    """Block tables (int64 arrays) -> [B, max(width, longest)] int32, zero-padded: each row its
    table's bytes then zero bytes, one conversion (not one an id: 8 sequences of 64k tokens were
    ~0.3 ms a step)."""
    width = max(1, width, max(map(len, blocks)))
    rows = b"".join([part for ids in blocks for part in (ids, bytes(8 * (width - len(ids))))])
    return np.frombuffer(rows, np.int64).reshape(len(blocks), width).astype(np.int32)  # [B, width]


def _table(blocks: list[array], device: torch.device, width: int = 0) -> torch.Tensor:
    return from_host(_host_table(blocks, width), device)


def _columns(
    batch: RaggedBatch, slots: tuple[int, ...], rates: set[int], freqs: torch.Tensor, device: torch.device
) -> tuple[tuple[Column, ...], dict[int, Closed | None]]:
    """The step by column, and per rate the windows it closes: which token closes a window is
    decided here, on the host, once for every layer."""
    widest, host_slots, row0 = max(batch.news), np.asarray(slots, dtype=np.int64), np.asarray(batch.row0s)
    news, starts = np.asarray(batch.news), np.asarray(batch.starts, dtype=np.int64)
    columns, closing_seqs, closing_entries = [], {r: [] for r in rates}, {r: [] for r in rates}
    for j in range(widest):
        seqs = np.flatnonzero(news > j)
        positions = starts[seqs] + j
        rows = None if widest == 1 else from_host(row0[seqs].astype(np.int64) + j, device)
        at, closing = {}, {}
        for r in rates:
            window_row = positions % r
            at[r] = from_host(window_row, device)
            done = np.flatnonzero(window_row == r - 1)
            entries = positions[done] // r
            closing[r] = None
            if done.size:
                closing[r] = Closing(from_host(host_slots[seqs[done]], device), from_host(entries > 0, device))
            closing_seqs[r].append(seqs[done])
            closing_entries[r].append(entries)
        columns.append(Column(rows, from_host(host_slots[seqs], device), at, closing))
    closed = {}
    for r in rates:
        closes, entries = np.concatenate(closing_seqs[r]), from_host(np.concatenate(closing_entries[r]), device)
        closed[r] = Closed(from_host(closes, device), entries, *cos_sin(freqs, entries * r)) if closes.size else None
    return tuple(columns), closed


def _closing_column(
    batch: RaggedBatch, real: int, slots: tuple[int, ...], rates: set[int], freqs: torch.Tensor, pad_slot: int, device
) -> tuple[tuple[Column, ...], dict[int, Closed | None]]:
    """``_columns`` of a decode step of a ``Bucket`` (its first ``real`` rows the sequences'): every
    row listed as closing a window, those that do not (and padding rows) redirected to the pad
    sequence's slot, table row and entry 0."""
    rows, host_slots = np.arange(batch.num_seqs), np.asarray(slots, dtype=np.int64)
    positions, pad_row = np.asarray(batch.starts, dtype=np.int64), batch.num_seqs
    at, closing, closed = {}, {}, {}
    for r in rates:
        done = (positions % r == r - 1) & (rows < real)
        entries = np.where(done, positions // r, 0)
        at[r] = from_host(positions % r, device)
        closing[r] = Closing(from_host(np.where(done, host_slots, pad_slot), device), from_host(entries > 0, device))
        on_device = from_host(entries, device)
        closed[r] = Closed(from_host(np.where(done, rows, pad_row), device), on_device, *cos_sin(freqs, on_device * r))
    return (Column(None, from_host(host_slots, device), at, closing),), closed


def _padded(pools: KVPools, seq_ids, starts, chunks, bucket: Bucket | None):
    """The step's sequences, starts and chunks, then a bucket's padding rows (the pad sequence's
    first token, again)."""
    seqs = [pools.sequences[s] for s in seq_ids]
    if bucket is None:
        return seqs, list(starts), list(chunks)
    if bucket.pad in seq_ids or len(seq_ids) > bucket.seqs or any(len(c) != 1 for c in chunks):
        raise ValueError(f"a bucket plans decode steps of up to {bucket.seqs} sequences (pad excluded)")
    if max(starts, default=0) >= bucket.tokens:
        raise ValueError(f"a sequence is longer than the bucket's {bucket.tokens} tokens")
    fill = bucket.seqs - len(seq_ids)
    return seqs + [pools.sequences[bucket.pad]] * fill, list(starts) + [0] * fill, list(chunks) + [[0]] * fill


def plan_step(
    cfg: ModelConfig,
    pools: KVPools,
    seq_ids: list[str],
    starts: list[int],
    chunks: list[list[int]],
    options: AttentionOptions,
    bucket: Bucket | None = None,
) -> StepPlan:
    """Sequence ``seq_ids[s]`` feeds ``chunks[s]`` (non-empty) at positions ``starts[s]`` onwards;
    with a ``bucket``, one token each, padded to the bucket's shape (Triton backend).

    Pure metadata: the caller has reserved the blocks (``KVPools.reserve``) and commits the
    tokens it keeps after the forward (``KVPools.commit``).
    """
    if any(not chunk for chunk in chunks):
        raise ValueError("every sequence in a step needs at least one token")
    if bucket is not None and options.backend != "triton":
        raise ValueError("a bucket's steps need the triton backend (the torch twins read host values per step)")
    device, layout = pools.device, pools.layout
    seqs, starts, chunks = _padded(pools, seq_ids, starts, chunks, bucket)
    batch = RaggedBatch.build(starts, [len(c) for c in chunks], device)
    main = _freqs(cfg.rope_main, cfg.rope_head_dim, device)
    compress = _freqs(cfg.rope_compress, cfg.rope_head_dim, device)
    slots = tuple(s.tables["compressor"][0] if s.tables["compressor"] else 0 for s in seqs)
    window_blocks = _host_table([s.tables["window"] for s in seqs])
    window_table = from_host(window_blocks, device)
    attend, ring = sparse_attention_prefill, None
    rates = {r for r in cfg.compress_rates.values() if r}
    widest, bs = max(batch.news), layout.block_size
    if options.backend == "torch" and widest <= min(FEW_ROWS, window_table.shape[1] * bs):
        # decode or a speculative verify: the window's gathers, masks and write slots serve every layer
        ring = DecodeWindow.build(batch, window_blocks, bs, cfg.sliding_window)
    if ring is not None or widest == 1:
        attend = partial(sparse_attention_decode, ring=ring)
    if bucket is None:
        columns, closed = _columns(batch, slots, rates, compress, device) if widest <= FEW_ROWS else ((), {})
        longest = {r: max((s + n) // r for s, n in zip(starts, batch.news, strict=True)) for r in rates}
        tables = {p: _table([s.tables[p] for s in seqs], device) for p in GROWING_POOLS}
    else:
        pad = pools.sequences[bucket.pad]
        # as wide as the bucket: blocks reserved ahead (a request's whole length, at admission) hold
        # no entry a step of the bucket reads or writes
        width = {p: layout.blocks_for(p, bucket.tokens) for p in GROWING_POOLS}
        if any(width[p] and not pad.tables[p] for p in GROWING_POOLS):
            raise ValueError("the pad sequence needs a block in every growing pool (reserve it max rate tokens)")
        pad_slot = pad.tables["compressor"][0] if pad.tables["compressor"] else 0
        columns, closed = _closing_column(batch, len(seq_ids), slots, rates, compress, pad_slot, device)
        longest = {r: bucket.tokens // r for r in rates}
        tables = {p: _table([s.tables[p][: width[p]] for s in [*seqs, pad]], device, width[p]) for p in GROWING_POOLS}
    return StepPlan(
        token_ids=from_host(np.fromiter((t for c in chunks for t in c), dtype=np.int64), device),
        batch=batch,
        rope_main=RopeTable.at(main, batch.positions),
        rope_compress=RopeTable.at(compress, batch.positions),
        freqs_compress=compress,
        window_table=window_table,
        tables=tables,
        slots=slots,
        options=options,
        attend=attend,
        visible={r: torch.div(batch.positions + 1, r, rounding_mode="floor") for r in rates},
        longest=longest,
        columns=columns,
        closed=closed,
        ring=ring,
    )
