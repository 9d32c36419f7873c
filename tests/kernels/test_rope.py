"""The RoPE kernel (interpreted on CPU, compiled on a GPU) against its torch twin and against the
rotation written out by hand: each trailing pair (a, b) -> (a cos - b sin, a sin + b cos)."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels.rope import rotate, rotate_torch


@pytest.mark.parametrize(("shape", "half"), [((5, 4, 32), 8), ((6, 24), 12), ((3, 2, 20), 3)])  # heads; a row; D=20
def test_rope_kernel_matches_the_twin_and_the_rotation_by_hand(shape, half, device, tol):
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(shape, generator=gen)
    angles = torch.rand(shape[0], half, generator=gen) * 6.3
    rotation = torch.polar(torch.ones_like(angles), angles)
    for inverse in (False, True):
        r = rotation.conj().resolve_conj() if inverse else rotation
        got = rotate(x.to(device), r.to(device), "triton").cpu()
        assert got.shape == x.shape and (got - rotate_torch(x, r)).abs().max().item() < 1e-5
        a, b = x[..., -2 * half :: 2], x[..., -2 * half + 1 :: 2]
        cos = angles.cos().view(shape[0], *([1] * (x.dim() - 2)), half)
        sin = (-1 if inverse else 1) * angles.sin().view(shape[0], *([1] * (x.dim() - 2)), half)
        assert torch.allclose(got[..., -2 * half :: 2], a * cos - b * sin, atol=1e-5)
        assert torch.allclose(got[..., -2 * half + 1 :: 2], a * sin + b * cos, atol=1e-5)
        assert torch.equal(got[..., : -2 * half], x[..., : -2 * half])  # the other channels as they were


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 needs a compiled kernel (the interpreter's is wrong)")
def test_rope_kernel_rounds_bf16_once_as_the_twin_does():
    gen = torch.Generator().manual_seed(42)
    x = torch.randn(64, 16, 512, generator=gen).to("cuda", torch.bfloat16)
    rotation = torch.polar(torch.ones(64, 32), torch.rand(64, 32, generator=gen) * 6.3).to("cuda")
    got, twin = rotate(x, rotation, "triton"), rotate_torch(x, rotation)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - twin.float()).abs() <= twin.float().abs() * 2.0**-7 + 1e-6).all()
