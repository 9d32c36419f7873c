"""A hyper-connection's mix, after its projection: N x N Sinkhorn and the collapse, fused.

  mixes    [T, (2 + N) * N]  fp32 projection of the rms-scaled streams (pre | post | comb logits)
  base     [(2 + N) * N]     fp32 biases; scale [3] fp32 (pre, post, comb)
  streams  [T, N, D]         the residual streams
  ->  collapsed [T, D] (streams' dtype) = sum_n pre[t, n] * streams[t, n]
      post [T, N] fp32, comb [T, N, N] fp32 (doubly stochastic after ``iters`` Sinkhorn passes)

The torch twin runs the Sinkhorn passes on all tokens at once, two ops per pass; the kernel
keeps one token's N x N matrix in registers and is one launch for the whole step. On CPU the
torch backend hands steps of few tokens (decode) to compiled loops (``hyper_cpu``): there the
twin's ops are all dispatch overhead. ``hyper_merge`` is the mix's other half, after the block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .batch import Backend
from .hyper_cpu import FEW_TOKENS, fits_cpu, merge_cpu, mix_collapse_cpu, mix_weights_cpu


def hyper_mix_torch(
    mixes: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, streams: torch.Tensor, iters: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = streams.shape[1]
    pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.split([n, n, n * n])
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = _sinkhorn(torch.softmax(comb_w.view(-1, n, n) * scale[2] + comb_b.view(n, n), dim=-1), iters, eps)
    return _collapse(pre, streams), post, comb


def hyper_merge(
    streams: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, backend: Backend = "torch"
) -> torch.Tensor:
    """streams [T, N, D], block_out [T, D], the mix's post [T, N] and comb [T, N, N] fp32 -> new
    streams [T, N, D]: the block's output spread by ``post`` onto the streams mixed by ``comb``
    (the triton backend: one launch, in fp32, rounded once, for the twin's five)."""
    t, n, d = streams.shape
    if backend == "triton" and not n & (n - 1):
        out = torch.empty_like(streams)
        if t:
            side = min(1024, triton.next_power_of_2(d))
            _merge_kernel[(t, triton.cdiv(d, side))](
                streams.contiguous(),
                block_out.contiguous(),
                post.float().contiguous(),
                comb.float().contiguous(),
                out,
                d,
                N=n,
                BD=side,
            )
        return out
    if fits_cpu(streams) and block_out.dtype == torch.float32:
        return merge_cpu(streams, block_out, post, comb)
    return hyper_merge_torch(streams, block_out, post, comb)


def hyper_merge_torch(
    streams: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    dtype = streams.dtype
    mixed = torch.bmm(comb.to(dtype).transpose(-1, -2), streams)
    return post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2) + mixed


def _collapse(pre: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def _sinkhorn(probs: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """probs [T, N, N] (rows sum to one) -> (probs + eps) after a column pass and ``iters - 1``
    (row, column) passes, each dividing by (sum + eps): [T, N, N] contiguous (the merge's batched
    matmul is ~10x slower on the strided view at prefill sizes), computed in a [N + 1, N + 1, T]
    buffer. Tokens are innermost there, so a sum is N + 1 vector adds; the eps is the buffer's
    pad row and column, so a pass is one sum and one in-place division (a sum into a fresh
    tensor: ``out=`` costs more per call than the allocation at decode sizes)."""
    t, n, _ = probs.shape
    padded = probs.new_full((n + 1, n + 1, t), eps)
    padded[n, n] = 0
    comb, rows, cols = padded[:n, :n], padded[:n], padded[:, :n]  # [N, N, T], [N, N + 1, T], [N + 1, N, T]
    comb.copy_(probs.permute(1, 2, 0)).add_(eps)
    comb.div_(cols.sum(0, keepdim=True))
    for _ in range(iters - 1):
        comb.div_(rows.sum(1, keepdim=True))
        comb.div_(cols.sum(0, keepdim=True))
    return comb.permute(2, 0, 1).contiguous()


@triton.jit
def _mix_kernel(
    mix_ptr,
    base_ptr,
    scale_ptr,
    streams_ptr,
    out_ptr,
    post_ptr,
    comb_ptr,
    D,
    iters,
    eps,
    N: tl.constexpr,
    BD: tl.constexpr,
):
    t = tl.program_id(0)
    width = (2 + N) * N
    i = tl.arange(0, N)
    row, col = i[:, None], i[None, :]
    s_pre, s_post, s_comb = tl.load(scale_ptr), tl.load(scale_ptr + 1), tl.load(scale_ptr + 2)
    pre = tl.sigmoid(tl.load(mix_ptr + t * width + i) * s_pre + tl.load(base_ptr + i)) + eps
    post = 2.0 * tl.sigmoid(tl.load(mix_ptr + t * width + N + i) * s_post + tl.load(base_ptr + N + i))
    at = 2 * N + row * N + col
    logits = tl.load(mix_ptr + t * width + at) * s_comb + tl.load(base_ptr + at)
    e = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    comb = e / tl.sum(e, axis=1)[:, None] + eps
    comb = comb / (tl.sum(comb, axis=0)[None, :] + eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=1)[:, None] + eps)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + eps)
    tl.store(post_ptr + t * N + i, post)
    tl.store(comb_ptr + t * N * N + row * N + col, comb)
    for d0 in range(0, D, BD):
        d = d0 + tl.arange(0, BD)
        ok = d[None, :] < D
        x = tl.load(streams_ptr + t * N * D + row * D + d[None, :], mask=ok, other=0.0).to(tl.float32)
        collapsed = tl.sum(pre[:, None] * x, axis=0)
        tl.store(out_ptr + t * D + d, collapsed.to(out_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def _merge_kernel(streams_ptr, block_ptr, post_ptr, comb_ptr, out_ptr, D, N: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    ok = d < D
    i = tl.arange(0, N)
    at = t * N * D + i[:, None] * D + d[None, :]  # [N, BD]
    x = tl.load(streams_ptr + at, mask=ok[None, :], other=0.0).to(tl.float32)
    comb = tl.load(comb_ptr + t * N * N + i[:, None] * N + i[None, :])  # [from i, to j]
    mixed = tl.sum(comb[:, :, None] * x[:, None, :], axis=0)  # [j, BD]: sum_i comb[i, j] x[i]
    spread = tl.load(post_ptr + t * N + i)[:, None] * tl.load(block_ptr + t * D + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (mixed + spread).to(out_ptr.dtype.element_ty), mask=ok[None, :])


def hyper_mix(
    mixes: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    streams: torch.Tensor,
    iters: int,
    eps: float,
    backend: Backend = "torch",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(collapsed [T, D], post [T, N], comb [T, N, N]); see the module docstring."""
    t, n, d = streams.shape
    if mixes.shape != (t, (2 + n) * n) or base.shape != ((2 + n) * n,) or scale.numel() != 3:
        raise ValueError(f"bad shapes mixes {tuple(mixes.shape)} base {tuple(base.shape)} streams {(t, n, d)}")
    if backend == "torch" and streams.device.type == "cpu" and t <= FEW_TOKENS:
        if fits_cpu(streams):
            return mix_collapse_cpu(mixes, base, scale, streams, n, iters, eps)
        pre, post, comb = mix_weights_cpu(mixes, base, scale, n, iters, eps)
        return _collapse(pre, streams), post, comb
    if backend == "torch" or n & (n - 1):  # the kernel's N x N tile needs a power of two
        return hyper_mix_torch(mixes, base, scale, streams, iters, eps)
    out = torch.empty(t, d, dtype=streams.dtype, device=streams.device)
    post = torch.empty(t, n, dtype=torch.float32, device=streams.device)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=streams.device)
    if t:
        _mix_kernel[(t,)](
            mixes.float().contiguous(),
            base.float().contiguous(),
            scale.float().contiguous(),
            streams.contiguous(),
            out,
            post,
            comb,
            d,
            iters,
            eps,
            N=n,
            BD=min(1024, triton.next_power_of_2(d)),
        )
    return out, post, comb
