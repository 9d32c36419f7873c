"""The CPU decode path's compiled loops (numba: kernels/hyper_cpu.py, kernels/norms_cpu.py) against
the torch definitions and float64: the same fp32 arithmetic, so within an ulp or so."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.mark.parametrize(("n", "t"), [(4, 1), (4, 7), (3, 2), (2, 256)])  # decode sizes; N not a power of two
def test_compiled_cpu_mix_matches_the_twin(n, t):
    """The CPU decode path (one numba loop, kernels/hyper_cpu.py) against the torch twin: the same
    fp32 arithmetic, so within a few ulps (exp and the sums' rounding order)."""
    from dayzero.kernels.hyper import hyper_mix, hyper_mix_torch
    from dayzero.kernels.hyper_cpu import FEW_TOKENS

    assert t <= FEW_TOKENS  # so hyper_mix takes the compiled loop
    gen = torch.Generator().manual_seed(11)
    width = (2 + n) * n
    mixes, base = 3 * torch.randn(t, width, generator=gen), torch.randn(width, generator=gen)
    scale, streams = torch.rand(3, generator=gen) + 0.5, torch.randn(t, n, 40, generator=gen)
    want = hyper_mix_torch(mixes, base, scale, streams, 20, 1e-6)
    got = hyper_mix(mixes, base, scale, streams, 20, 1e-6, backend="torch")
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert (g - w).abs().max().item() < 1e-6


def test_compiled_cpu_rms_norms_match_the_torch_path_and_float64():
    """RMS norms of a few fp32 tokens (the compiled loops) and of many (the torch definition), both
    against w * x / sqrt(mean(x^2) + eps) in float64, and against each other on the same rows."""
    from dayzero.kernels.hyper_cpu import FEW_TOKENS, fits_cpu
    from dayzero.kernels.norms import rms_norm, rms_scale

    gen = torch.Generator().manual_seed(14)
    x, w = torch.randn(FEW_TOKENS + 9, 3, 48, generator=gen) * 3, torch.randn(48, generator=gen)
    x64 = x.double()
    scaled = x64 / (x64.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    few = x[:5]
    assert fits_cpu(few) and not fits_cpu(x)
    for got_many, got_few, want in (
        (rms_norm(x, w, 1e-6), rms_norm(few, w, 1e-6), w.double() * scaled),
        (rms_scale(x, 1e-6), rms_scale(few, 1e-6), scaled),
    ):
        assert got_few.shape == few.shape and got_few.dtype == torch.float32
        assert (got_many - want).abs().max().item() < 1e-5
        assert (got_few - want[:5]).abs().max().item() < 1e-5
        assert (got_few - got_many[:5]).abs().max().item() < 1e-5


@pytest.mark.parametrize(("n", "t"), [(4, 1), (3, 5)])
def test_compiled_cpu_merge_matches_the_twin(n, t):
    """The merge after a block on the CPU decode path (numba) against the torch definition, written
    out here: sum_i comb[t, i, j] * streams[t, i] + post[t, j] * block_out[t], within an ulp or so."""
    from dayzero.kernels.hyper import hyper_merge
    from dayzero.kernels.hyper_cpu import fits_cpu

    gen = torch.Generator().manual_seed(12)
    streams, block_out = torch.randn(t, n, 40, generator=gen), torch.randn(t, 40, generator=gen)
    post, comb = torch.rand(t, n, generator=gen), torch.rand(t, n, n, generator=gen)
    assert fits_cpu(streams)  # so hyper_merge takes the compiled loop
    want = (
        torch.einsum("tij,tid->tjd", comb.double(), streams.double())
        + post.double()[..., None] * block_out.double()[:, None]
    )
    got = hyper_merge(streams, block_out, post, comb)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max().item() < 1e-5
    twin = hyper_merge(streams.bfloat16(), block_out.bfloat16(), post, comb).float()  # bf16: the torch path
    assert (twin - want).abs().max().item() < 0.1


@pytest.mark.parametrize(("n", "t"), [(4, 1), (3, 5)])
def test_compiled_cpu_collapse_and_merge_match_the_twins(n, t):
    """A block's hyper-connection on the CPU decode path (``collapse`` in numpy from the streams to
    the merge, post and comb never in torch) against the torch twins one after the other."""
    import torch.nn.functional as F

    from dayzero.kernels.hyper import hyper_merge_torch, hyper_mix_torch
    from dayzero.kernels.hyper_cpu import fits_cpu
    from dayzero.kernels.norms import rms_scale_torch
    from dayzero.model.hyper import collapse

    gen = torch.Generator().manual_seed(13)
    width = (2 + n) * n
    streams, fn = torch.randn(t, n, 40, generator=gen), torch.randn(width, n * 40, generator=gen) / 8
    base, scale = torch.randn(width, generator=gen), torch.rand(3, generator=gen) + 0.5
    block_out = torch.randn(t, 40, generator=gen)
    assert fits_cpu(streams)  # so collapse takes the compiled loops
    mixes = F.linear(rms_scale_torch(streams.flatten(1), 1e-6), fn)
    want, post, comb = hyper_mix_torch(mixes, base, scale, streams, 20, 1e-6)
    want_merged = hyper_merge_torch(streams, block_out, post, comb)
    got, mix = collapse(streams, fn, base, scale, 20, 1e-6, 1e-6)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max().item() < 1e-5
    merged = mix.merge(streams, block_out)
    assert merged.dtype == torch.float32 and (merged - want_merged).abs().max().item() < 1e-5


def test_a_cpu_collapse_mixes_and_collapses_in_one_call_of_compiled_code(monkeypatch):
    """A call of compiled code from Python checks its arguments' types (~2 us): the mix and the
    collapse after it are one call (``_mix_collapse``), eight fewer a demo decode step. With the
    separate loops unreachable from Python, both CPU collapses still run and match the twin."""
    from dayzero.kernels import hyper_cpu
    from dayzero.kernels.hyper import hyper_mix_torch

    gen = torch.Generator().manual_seed(15)
    streams, fn = torch.randn(2, 4, 40, generator=gen), torch.randn(24, 160, generator=gen)
    base, scale = torch.randn(24, generator=gen), torch.rand(3, generator=gen) + 0.5
    flat = torch.from_numpy(hyper_cpu.rms_scale_rows(streams.flatten(1).numpy(), np.float32(1e-6)))
    mixes = torch.nn.functional.linear(flat, fn)
    want = hyper_mix_torch(mixes, base, scale, streams, 20, 1e-6)
    hyper_cpu.collapse_cpu(streams, fn, base, scale, 20, 1e-6, 1e-6)  # compiled (or loaded) before the patch
    hyper_cpu.mix_collapse_cpu(mixes, base, scale, streams, 4, 20, 1e-6)
    for name in ("_mix", "_collapse"):
        monkeypatch.setattr(hyper_cpu, name, lambda *args: pytest.fail("a separate call of compiled code"))
    collapsed, post, comb = hyper_cpu.collapse_cpu(streams, fn, base, scale, 20, 1e-6, 1e-6)
    for got in (
        (collapsed, torch.from_numpy(post), torch.from_numpy(comb)),
        hyper_cpu.mix_collapse_cpu(mixes, base, scale, streams, 4, 20, 1e-6),
    ):
        assert all((g - w).abs().max().item() < 1e-5 for g, w in zip(got, want, strict=True))
