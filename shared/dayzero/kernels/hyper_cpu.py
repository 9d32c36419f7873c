"""The hyper-connection mix's pre / post / Sinkhorn and collapse, and the merge after the block,
as compiled CPU loops (numba), for steps of few fp32 tokens: a decode step's mix is 16 numbers a
token, so the torch twin's ~90 ops (two per Sinkhorn pass) are all dispatch overhead there (~350 us
a collapse vs ~20 us here, one token); the collapse and the merge are ~4 and ~8 small ops more.
The arithmetic is the twin's, in fp32 and the same order (sums left to right, then + eps, then
a division), so the two agree to an ulp or so (exp and the sums' rounding); see
``hyper_mix_torch`` for the definition and the test that holds them together.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
import torch.nn.functional as F

from .norms_cpu import rms_scale_rows, weight_array

FEW_TOKENS = 256  # above this the twin's vectorised passes are faster (measured: 512 tokens 1.2 vs 1.5 ms)


@numba.njit(cache=True)
def _mix(mixes, base, scale, n, iters, eps):
    t_all, one = mixes.shape[0], np.float32(1)
    pre, post = np.empty((t_all, n), np.float32), np.empty((t_all, n), np.float32)
    comb = np.empty((t_all, n, n), np.float32)
    for t in range(t_all):
        for i in range(n):
            pre[t, i] = one / (one + np.exp(-(mixes[t, i] * scale[0] + base[i]))) + eps
            post[t, i] = np.float32(2) / (one + np.exp(-(mixes[t, n + i] * scale[1] + base[n + i])))
        for i in range(n):  # softmax of each row of the comb logits, + eps
            top = np.float32(-np.inf)
            for j in range(n):
                at = 2 * n + i * n + j
                comb[t, i, j] = mixes[t, at] * scale[2] + base[at]
                top = max(top, comb[t, i, j])
            total = np.float32(0)
            for j in range(n):
                comb[t, i, j] = np.exp(comb[t, i, j] - top)
                total += comb[t, i, j]
            for j in range(n):
                comb[t, i, j] = comb[t, i, j] / total + eps
        for it in range(iters):  # a column pass, then (row, column) passes
            if it:
                for i in range(n):
                    total = comb[t, i, 0]
                    for j in range(1, n):
                        total += comb[t, i, j]
                    total += eps
                    for j in range(n):
                        comb[t, i, j] /= total
            for j in range(n):
                total = comb[t, 0, j]
                for i in range(1, n):
                    total += comb[t, i, j]
                total += eps
                for i in range(n):
                    comb[t, i, j] /= total
    return pre, post, comb


@numba.njit(cache=True)
def _collapse(pre, streams):
    """sum_n pre[t, n] * streams[t, n] in order n = 0, 1, ... (the twin's sum over dim 1)."""
    t_all, n, d = streams.shape
    out = np.empty((t_all, d), np.float32)
    for t in range(t_all):
        for k in range(d):
            out[t, k] = pre[t, 0] * streams[t, 0, k]
        for i in range(1, n):
            w = pre[t, i]
            for k in range(d):
                out[t, k] += w * streams[t, i, k]
    return out


@numba.njit(cache=True)
def _merge(streams, block_out, post, comb):
    """post[t, j] * block_out[t] + sum_i comb[t, i, j] * streams[t, i] for each stream j."""
    t_all, n, d = streams.shape
    out = np.empty((t_all, n, d), np.float32)
    for t in range(t_all):
        for j in range(n):
            w = comb[t, 0, j]
            for k in range(d):
                out[t, j, k] = w * streams[t, 0, k]
            for i in range(1, n):
                w = comb[t, i, j]
                for k in range(d):
                    out[t, j, k] += w * streams[t, i, k]
            w = post[t, j]
            for k in range(d):
                out[t, j, k] = w * block_out[t, k] + out[t, j, k]
    return out


@numba.njit(cache=True)
def _mix_collapse(mixes, base, scale, n, iters, eps, streams):
    """``_mix``, then the collapse of ``streams`` by its pre, in one call (a call of compiled code
    from Python costs ~2 us here, its arguments' types checked; eight collapses a demo decode step)."""
    pre, post, comb = _mix(mixes, base, scale, n, iters, eps)
    return _collapse(pre, streams), post, comb


def fits_cpu(streams: torch.Tensor) -> bool:
    """Whether a step's tensor [T, ...] takes the compiled loops (these and ``norms_cpu``'s): few
    tokens of contiguous fp32 on the CPU (``is_cpu``: ``.device`` builds a device object, ~1 us)."""
    return (
        streams.is_cpu and streams.dtype == torch.float32 and streams.shape[0] <= FEW_TOKENS and streams.is_contiguous()
    )


def collapse_cpu(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """A hyper-connection collapse of streams [T, N, D] that ``fits_cpu`` (fp32 ``fn``, ``base``,
    ``scale``: weights): the rms-scaled streams' projection by ``fn`` (torch's matmul), the mix and
    the collapse, the streams viewed in numpy once -> (collapsed [T, D], post [T, N], comb [T, N, N]
    in numpy, for ``merge_cpu``). The arithmetic of ``rms_scale``, ``F.linear`` and ``hyper_mix``
    one after the other, in ~11 aten ops where they took ~28."""
    rows = streams.numpy()
    t, n, d = rows.shape
    flat = torch.from_numpy(rms_scale_rows(rows.reshape(t, n * d), np.float32(norm_eps)))
    collapsed, post, comb = _mix_arrays(F.linear(flat, fn).numpy(), base, scale, n, iters, eps, rows)
    return torch.from_numpy(collapsed), post, comb


def mix_weights_cpu(
    mixes: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, N], post [T, N], comb [T, N, N]) fp32 of contiguous fp32 CPU tensors ``mixes``
    [T, (2 + N) * N], ``base`` and ``scale`` (no torch op: a decode step's op count is its cost)."""
    return tuple(torch.from_numpy(a) for a in _mix_arrays(mixes.numpy(), base, scale, n, iters, eps))


def mix_collapse_cpu(
    mixes: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, streams: torch.Tensor, n: int, iters: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(collapsed [T, D], post, comb) of ``streams`` that ``fits_cpu``: ``mix_weights_cpu``, then the
    collapse as one loop, pre handed from one loop to the other in numpy (to torch and back it was
    five aten ops, forty a demo decode step)."""
    arrays = _mix_arrays(mixes.numpy(), base, scale, n, iters, eps, streams.numpy())
    return tuple(torch.from_numpy(a) for a in arrays)


def _mix_arrays(mixes: np.ndarray, base, scale, n, iters, eps, streams: np.ndarray | None = None):
    """``_mix`` of the weights' kept views -> (pre, post, comb); given ``streams``, ``_mix_collapse``
    -> (collapsed, post, comb)."""
    args = (mixes, weight_array(base), weight_array(scale), n, iters, np.float32(eps))
    return _mix(*args) if streams is None else _mix_collapse(*args, streams)


def merge_cpu(
    streams: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor | np.ndarray, comb: torch.Tensor | np.ndarray
) -> torch.Tensor:
    """``hyper_merge`` of streams that ``fits_cpu`` (block_out [T, D] fp32), as one loop; ``post`` and
    ``comb`` as tensors or as ``collapse_cpu`` left them in numpy."""
    arrays = (x if isinstance(x, np.ndarray) else x.contiguous().numpy() for x in (streams, block_out, post, comb))
    return torch.from_numpy(_merge(*arrays))  # (.contiguous(): a no-op when contiguous)
