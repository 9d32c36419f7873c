"""The RoPE kernel (interpreted on CPU, compiled on a GPU) against its torch twin and against the
rotation written out by hand: each trailing pair (a, b) -> (a cos - b sin, a sin + b cos)."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels.rope import rotate, rotate_torch


@pytest.mark.parametrize(
    ("shape", "half"),
    [
        ((5, 4, 32), 8),  # heads
        ((6, 24), 12),  # a row a token
        ((3, 2, 20), 3),  # D=20
        ((5, 67, 40), 12),  # 67 heads: a program's rows end inside a token, the last program's part empty
        ((3, 64, 512), 32),  # DeepSeek-V4-Flash's query: 64 heads of 512, 64 rope channels
    ],
)
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


def _rotation_pair(tokens: int, half: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    angles = torch.rand(tokens, half, generator=gen) * 1000  # positions up to ~1000 at theta's fastest
    rotation = torch.complex(angles.cos(), angles.sin())
    return rotation, rotation.conj().resolve_conj()


@pytest.mark.parametrize("half", [8, 16, 24, 32])  # the demo's rope dims (16) and V4's (64), two more widths
@pytest.mark.parametrize("shape", [(1, 4), (3, 16), (7, 1)])  # (tokens, heads) or (tokens, 1) for a [T, D] row
def test_rope_cpu_loop_is_the_twin_bitwise(shape, half):
    """Few fp32 tokens on the CPU take the compiled loop (``rope_cpu``): the twin's complex multiply
    (a c - b s, a s + b c, each product rounded), so bitwise equal to it where torch's multiply runs
    in vector lanes: every pair when ``half`` is a multiple of 8, on AVX-512 and AVX2 alike (8 in the
    demo, 32 in V4; 4, 12 and 20 are not bitwise on either: ATEN_CPU_CAPABILITY=avx2 / avx512). The
    by-hand rotation in float64 bounds both."""
    from dayzero.kernels.hyper_cpu import fits_cpu
    from dayzero.kernels.rope_cpu import rotate_cpu

    tokens, heads = shape
    gen = torch.Generator().manual_seed(half + tokens)
    x = torch.randn(tokens, heads, 2 * half + 6, generator=gen) * 8
    x = x[:, 0] if heads == 1 else x
    assert fits_cpu(x)
    for r in _rotation_pair(tokens, half, seed=half):
        got, twin = rotate(x, r), rotate_torch(x, r)
        assert torch.equal(got, twin) and torch.equal(rotate_cpu(x, r.numpy()), twin)
        r64 = r.view(tokens, *([1] * (x.dim() - 2)), half).to(torch.complex128)
        a, b = x[..., -2 * half :: 2].double(), x[..., -2 * half + 1 :: 2].double()
        assert (got[..., -2 * half :: 2] - (a * r64.real - b * r64.imag)).abs().max().item() < 1e-5
        assert (got[..., -2 * half + 1 :: 2] - (a * r64.imag + b * r64.real)).abs().max().item() < 1e-5
        assert torch.equal(got[..., : -2 * half], x[..., : -2 * half])


@pytest.mark.parametrize("half", [3, 4, 5, 12, 22])  # 4: the tiny test checkpoints' (rope dims 8)
def test_rope_cpu_loop_of_odd_widths_is_within_an_ulp_or_so_of_the_twin(half):
    """Pairs past the last full vector lane of torch's multiply go through its scalar loop, compiled
    with fused multiply-adds where the CPU has them: there the two differ in the last bit or two."""
    x = torch.randn(5, 3, 2 * half + 2, generator=torch.Generator().manual_seed(half)) * 8
    for r in _rotation_pair(5, half, seed=half):
        got, twin = rotate(x, r), rotate_torch(x, r)
        assert ((got - twin).abs() <= twin.abs() * 2.0**-22 + 1e-6).all()


@pytest.mark.parametrize("shape", [(0, 4, 22), (0, 22)])
def test_rope_of_no_tokens_on_the_cpu_is_empty_as_the_twins(shape):
    """No tokens fit the compiled loop's test (``fits_cpu``) as the other CPU loops' (which give an empty
    result): numpy could not reshape an empty [0, ..., D] to [0, -1, D] and the call raised."""
    x, rotation = torch.randn(*shape), torch.complex(torch.ones(0, 8), torch.zeros(0, 8))
    got = rotate(x, rotation)
    assert got.shape == x.shape and torch.equal(got, rotate_torch(x, rotation))
