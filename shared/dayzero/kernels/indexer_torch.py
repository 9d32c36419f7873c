"""The indexer's scores in torch (the module docstring of indexer.py defines them): the spec in
plain fp32 (``indexer_scores_torch``), its all-rows-at-once twin for decode, and the torch backend's
blocks of rows (``torch_blocks``), each block's [rows, entries] scores from matmuls in cache-sized
pieces, or on a CPU with a small Di from the compiled loop in ``indexer_cpu``."""

from __future__ import annotations

import torch

from .attention_torch import FEW_ROWS
from .batch import RaggedBatch
from .indexer_cpu import FUSED_DEPTH_MAX, weighted_relu_rows, weighted_relu_scores

BUDGET = 1 << 22  # fp32 scores [rows, entries] of a block (one Triton launch, or one top-k)
CPU_BF16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()  # oneDNN multiplies bf16 fast
HEADS_BUDGET = 1 << 19  # fp32 [rows, Hi, entries] per torch matmul (2 MiB, cache-sized: ~3x faster than 16 MiB)


def _product_type(keys: torch.Tensor) -> torch.dtype:
    """The type the q . key products are taken in: a 16-bit cache's own where the device multiplies
    it fast (a GPU; bf16 on a CPU with AVX512-BF16, where it runs ~7x fp32's rate), else fp32. Each
    head's product is rounded to it (transformers' bf16 model does the same; the release's indexer
    simulates FP4 keys), the heads are summed in fp32."""
    if keys.dtype not in (torch.bfloat16, torch.float16):
        return torch.float32
    if keys.device.type != "cpu" or (keys.dtype == torch.bfloat16 and CPU_BF16):
        return keys.dtype
    return torch.float32


def _weighted_scores(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """sum_h weights[x, h] * relu(q[x, h] . keys[x, n]) * Di^-0.5 -> [X, n] fp32; ``keys`` [X or 1, n, Di]
    (or [n, Di]: one matmul [X * Hi, Di] x [Di, n]), the heads summed by a batched matvec; one
    query's [n, Hi] scores on a CPU in one compiled pass (``indexer_cpu``: a cache-sized block of
    several queries' gains nothing from it, ~450 ms either way for 2048 rows at 32k). ``out``: an
    fp32 [X, n] to write them to (a block's rows, where several queries are scored)."""
    kind = _product_type(keys)
    if q.shape[0] == 1 and keys.dim() == 2:  # one query (decode): [n, Di] x [Di, Hi], ~12% faster at 16k entries
        heads = torch.mm(keys.to(kind), q[0].to(kind).T)  # [n, Hi]
        if heads.device.type == "cpu":
            scores = weighted_relu_rows(heads, weights[0], q.shape[-1] ** -0.5)[None]
        else:
            scores = torch.mv(heads.float().relu_(), weights[0].float()).mul_(q.shape[-1] ** -0.5)[None]
        return scores if out is None else out.copy_(scores)
    heads = torch.matmul(q.to(kind), keys.to(kind).transpose(-1, -2)).float().relu_()  # [X, Hi, n]
    summed = torch.matmul(weights.float()[:, None, :], heads, out=None if out is None else out[:, None])
    return summed[:, 0].mul_(q.shape[-1] ** -0.5)


def _scores_in_pieces(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``_weighted_scores`` over ``keys`` [n, Di] a cache-sized piece of rows at a time, each written
    into its rows of ``out`` [X, n] fp32 (no pieces to concatenate) -> ``out``."""
    step = max(1, HEADS_BUDGET // (q.shape[1] * keys.shape[0]))
    for r in range(0, q.shape[0], step):
        _weighted_scores(q[r : r + step], weights[r : r + step], keys, out[r : r + step])
    return out


def indexer_scores_torch(
    q: torch.Tensor,
    weights: torch.Tensor,
    batch: RaggedBatch,
    keys: torch.Tensor,
    table: torch.Tensor,
    visible: torch.Tensor,
    first: int,
    count: int,
) -> torch.Tensor:
    """Scores of entries [first, first + count) for every query: [T, count] fp32, by the definition
    in plain fp32 torch (the spec the fast paths and the Triton kernel are tested against)."""
    out = torch.full((q.shape[0], count), float("-inf"), dtype=torch.float32, device=q.device)
    entry = torch.arange(first, first + count, device=q.device)
    for s in range(batch.num_seqs):
        rows = batch.rows(s)
        pool = keys[table[s].long()].flatten(0, 1)
        have = min(first + count, pool.shape[0]) - first
        if have <= 0:
            continue
        heads = torch.matmul(q[rows].float(), pool[first : first + have].float().T).relu_()  # [L, Hi, have]
        scores = (heads * weights[rows].float()[:, :, None]).sum(1) * q.shape[-1] ** -0.5
        hidden = entry[None, :have] >= visible[rows, None]
        out[rows, :have] = scores.masked_fill(hidden, float("-inf"))
    return out


def indexer_scores_decode_torch(
    q: torch.Tensor,
    weights: torch.Tensor,
    batch: RaggedBatch,
    keys: torch.Tensor,
    table: torch.Tensor,
    visible: torch.Tensor,
    first: int,
    count: int,
) -> torch.Tensor:
    """``indexer_scores_torch`` for rows that each have their own row of ``table`` (one query per
    sequence, or each row's sequence's), all at once (the CPU decode path). Tested equal to the spec."""
    out = torch.full((q.shape[0], count), float("-inf"), dtype=torch.float32, device=q.device)
    used = table[:, : -(-(first + count) // keys.shape[1])]
    pool = keys[used.long()].flatten(1, 2)  # [B, used blocks * bs, Di]
    have = min(first + count, pool.shape[1]) - first
    if have <= 0:
        return out
    scores = _weighted_scores(q, weights, pool[:, first : first + have])  # [B, have]
    entry = torch.arange(first, first + have, device=q.device)
    out[:, :have] = scores.masked_fill(entry[None, :] >= visible[:, None], float("-inf"))
    return out


def _sequence_keys(keys: torch.Tensor, blocks: list[int], count: int) -> torch.Tensor:
    """A sequence's first ``count`` entries [count, Di]: a view when its blocks are consecutive."""
    used = blocks[: -(-count // keys.shape[1])]
    if used == list(range(used[0], used[0] + len(used))):
        return keys[used[0] : used[0] + len(used)].flatten(0, 1)[:count]
    return keys[torch.tensor(used, device=keys.device)].flatten(0, 1)[:count]


def _masked(scores: torch.Tensor, visible: torch.Tensor, least: int) -> torch.Tensor:
    """-inf where entry >= the row's visible count; ``scores`` [R, n]. Every row sees the first
    ``least`` entries (min of ``visible``), so only the columns after them are masked."""
    entry = torch.arange(least, scores.shape[1], device=scores.device)
    scores[:, least:].masked_fill_(entry[None, :] >= visible[:, None], float("-inf"))
    return scores


def torch_blocks(q, weights, batch, keys, table, visible, visible_max, rows_max):
    """(rows, scores [R, n]) per block: one sequence's rows at a time, or every row of a step of
    several sequences with a few tokens each (decode, a speculative verify) together (keys
    gathered per row)."""
    heads = q.shape[1]
    if batch.num_seqs > 1 and max(batch.news) <= FEW_ROWS:
        step = rows_max or max(1, HEADS_BUDGET // (heads * visible_max))
        if max(batch.news) > 1:
            table = table[batch.seq_of_token.long()]  # each row's sequence's
        for r0 in range(0, q.shape[0], step):
            rows = slice(r0, min(r0 + step, q.shape[0]))
            args = (q[rows], weights[rows], batch, keys, table[rows], visible[rows], 0, visible_max)
            yield rows, indexer_scores_decode_torch(*args)
        return
    tables, held = table.tolist(), None  # held: the scores of each block of several rows in turn
    for s in range(batch.num_seqs):  # positions, so visible counts, grow along a sequence's rows
        row0, end = batch.row0s[s], batch.row0s[s] + batch.news[s]
        last = visible_max if batch.num_seqs == 1 else int(visible[end - 1])  # (one sequence: no read)
        step = rows_max or max(1, BUDGET // max(1, last))
        for r0 in range(row0, end, step):
            rows, n_rows = slice(r0, min(r0 + step, end)), min(step, end - r0)
            count = last if rows.stop == end else int(visible[rows.stop - 1])
            if count == 0:  # nothing visible yet: the output's -1 stands
                continue
            seq_keys = _sequence_keys(keys, tables[s], count)
            if n_rows == 1:  # one query (a decode step): its scores as computed, no buffer
                yield rows, _weighted_scores(q[rows], weights[rows], seq_keys)
                continue
            if held is None or held.numel() < n_rows * count:
                held = torch.empty(min(step, end - row0) * last, dtype=torch.float32, device=q.device)
            yield rows, _block_scores(q[rows], weights[rows], seq_keys, visible[rows], held[: n_rows * count])


def _block_scores(q, weights, keys, visible, held: torch.Tensor) -> torch.Tensor:
    """Masked scores [R, n] of a block's rows against ``keys`` [n, Di], written into ``held``: on a
    CPU with fp32 products and a small Di by one compiled loop (``indexer_cpu``: the products never
    reach memory, each row stops at its visible entries), else in torch pieces."""
    out = held.view(q.shape[0], keys.shape[0])
    if keys.device.type == "cpu" and q.shape[-1] <= FUSED_DEPTH_MAX and _product_type(keys) == torch.float32:
        return weighted_relu_scores(q, weights, keys, visible, out)
    least = int(visible[0])  # every row sees its first row's
    scores = _scores_in_pieces(q, weights, keys, out)
    return _masked(scores, visible, least) if least < keys.shape[0] else scores
