"""The indexer's head sum as compiled CPU loops (numba): sum_h w[h] * relu(scores[h]) in one pass
over the per-head scores, where torch makes two or three (relu, the matvec, and for bf16 products
the copy to fp32), each over the whole block of scores: for one query at 64k tokens that block is
[16384 entries, 64 heads], 4 MiB a pass in fp32 (0.3 vs 0.95 ms here; bf16 0.2-0.3 vs 1.1 ms). bf16
scores are widened by their bits (a bf16 is the high half of an fp32). The heads are summed in
fp32, in vector lanes (reassociated: the order of the sum is not torch's); relu is max(s, 0).

A block of prefill rows is scored by ``weighted_relu_scores``: q . key, relu, the weight and the
head sum for four heads at a time in registers, entries in vector lanes, where torch writes the
[rows, Hi, entries] products to memory and reads them back twice (relu, the head sum): with the
demo's Di = 16 those products are 16 multiply-adds each, so torch moves a float per 16 MACs
(~17 GMAC/s here) where the loop reaches ~30-39 (one core, [512 rows, 16 x 16, 8192 entries]).
Each row stops at its visible entries (the causal part is never computed) and is masked -inf past
them. The dot over Di is unrolled at compile time (one compiled loop per Di), so it is used for a
small Di only, where torch's product is bound by writing its output, not by its multiply-adds.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _weighted_relu(values, weights):
    total = np.float32(0)
    for h in range(values.shape[0]):
        total += weights[h] * max(values[h], np.float32(0))
    return total


@numba.njit(cache=True)
def _rows_f32(heads, weights, scale):
    out = np.empty(heads.shape[0], np.float32)
    for n in range(heads.shape[0]):
        out[n] = _weighted_relu(heads[n], weights) * scale
    return out


@numba.njit(cache=True)
def _rows_bf16(bits, weights, scale):
    out = np.empty(bits.shape[0], np.float32)
    wide = np.empty(bits.shape[1], np.uint32)
    values = wide.view(np.float32)
    for n in range(bits.shape[0]):
        for h in range(bits.shape[1]):
            wide[h] = np.uint32(np.uint16(bits[n, h])) << np.uint32(16)
        out[n] = _weighted_relu(values, weights) * scale
    return out


def weighted_relu_rows(heads: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, Hi] per-head scores (fp32 or bf16, contiguous), [Hi] weights -> [n] fp32
    ``scale * sum_h weights[h] * relu(heads[:, h])``."""
    w = weights.float().numpy()
    if heads.dtype == torch.bfloat16:
        return torch.from_numpy(_rows_bf16(heads.view(torch.int16).numpy(), w, np.float32(scale)))
    return torch.from_numpy(_rows_f32(heads.numpy(), w, np.float32(scale)))


ENTRY_CHUNK_BYTES = 1 << 18  # keys [Di, chunk] read by every row of a block: 256 KiB stays in L2
CLAIMS_PER_THREAD = 8  # row claims per thread: a stalled thread holds up 1/8 of a share (2 threads, 512 rows: 32)
FUSED_DEPTH_MAX = 16  # largest Di for the compiled loop: at 32 LLVM leaves the dot rolled (1.2 GMAC/s)


@functools.cache
def _block_kernel(depth: int):
    """The compiled block loop for Di = ``depth`` (a constant: the dot unrolls, entries fill the lanes)."""

    @numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, boundscheck=False)
    def kernel(q, w, keys_t, visible, scale, out):
        rows, heads = w.shape
        chunks, chunk = keys_t.shape[0], keys_t.shape[2]
        zero, n = np.float32(0), out.shape[1]
        grouped = heads - heads % 4
        acc = np.empty(chunk, np.float32)  # contiguous, indexed from 0: the loops below fill vector lanes
        for c in range(chunks):
            keys_c, c0 = keys_t[c], c * chunk
            for r in range(rows):
                seen = min(visible[r], n) - c0
                if seen <= 0:
                    continue
                m = min(seen, chunk)
                acc[:m] = zero
                for h in range(0, grouped, 4):  # four heads' dots share each key load
                    w0, w1, w2, w3 = w[r, h], w[r, h + 1], w[r, h + 2], w[r, h + 3]
                    for e in range(m):
                        a0, a1, a2, a3 = zero, zero, zero, zero
                        for d in range(depth):
                            k = keys_c[d, e]
                            a0 += q[r, h, d] * k
                            a1 += q[r, h + 1, d] * k
                            a2 += q[r, h + 2, d] * k
                            a3 += q[r, h + 3, d] * k
                        acc[e] += w0 * max(a0, zero) + w1 * max(a1, zero) + w2 * max(a2, zero) + w3 * max(a3, zero)
                for h in range(grouped, heads):
                    for e in range(m):
                        a0 = zero
                        for d in range(depth):
                            a0 += q[r, h, d] * keys_c[d, e]
                        acc[e] += w[r, h] * max(a0, zero)
                for e in range(m):
                    out[r, c0 + e] = acc[e] * scale
        for r in range(rows):
            out[r, max(0, min(visible[r], n)) :] = -np.inf
        return out

    return kernel


def weighted_relu_scores(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """A block's scores into ``out`` [R, n] fp32: ``Di^-0.5 * sum_h weights[r, h] * relu(q[r, h] .
    keys[e])`` for e < visible[r], -inf after; q [R, Hi, Di], weights [R, Hi], keys [n, Di] (fp32
    products), visible [R] int32, Di <= FUSED_DEPTH_MAX. torch's intra-op thread count of threads
    claim the rows a few at a time (``CLAIMS_PER_THREAD``): a thread the OS leaves waiting holds up
    only the rows it claimed, the others score the rest (threads started per call: nothing held
    across a worker's fork; a thread's failure raises here). A row's scores do not depend on the
    thread or the claim: the same bits however the rows are shared."""
    depth = q.shape[-1]
    n, chunk = keys.shape[0], max(16, ENTRY_CHUNK_BYTES // (4 * depth))
    chunks = -(-n // chunk)
    padded = torch.nn.functional.pad(keys.float(), (0, 0, 0, chunks * chunk - n))
    keys_t = padded.view(chunks, chunk, depth).transpose(1, 2).contiguous().numpy()  # [chunks, Di, chunk]
    kernel, scale = _block_kernel(depth), np.float32(depth**-0.5)
    q, w, visible, scores = (
        q.float().contiguous().numpy(),
        weights.float().contiguous().numpy(),
        visible.numpy(),
        out.numpy(),
    )
    rows = q.shape[0]
    threads = max(1, min(torch.get_num_threads(), rows))
    claim = -(-rows // (threads * CLAIMS_PER_THREAD))
    starts = itertools.count(0, claim)  # each next() hands one claim to one thread (a single step under the GIL)

    def score_claims() -> None:
        while (a := next(starts)) < rows:
            kernel(q[a : a + claim], w[a : a + claim], keys_t, visible[a : a + claim], scale, scores[a : a + claim])

    with ThreadPoolExecutor(max(1, threads - 1)) as helpers:  # (the loop lets go of the GIL); joined on exit
        started = [helpers.submit(score_claims) for _ in range(threads - 1)]
        score_claims()
        for helper in started:
            helper.result()  # a helper's failure raises here, not left as its rows' old scores
    return out
