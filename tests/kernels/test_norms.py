"""The RMS-norm kernel (interpreted on CPU, compiled on a GPU) against its torch twin and against
the definition written out in float64: w * x / sqrt(mean(x^2) + eps)."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels.norms import rms_norm, rms_norm_torch, rms_scale, rms_scale_torch

EPS = 1e-6


def _definition(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    x64 = x.double()
    scaled = x64 / (x64.square().mean(-1, keepdim=True) + EPS).sqrt()
    return scaled if weight is None else weight.double() * scaled


# rows of a matrix, of heads; not a power of two; 335 rows of 40: six programs of 64 rows, the last part empty
@pytest.mark.parametrize("shape", [(5, 48), (3, 4, 40), (2, 1030), (5, 67, 40)])
def test_rms_kernel_matches_the_twin_and_the_definition(shape, device, tol):
    gen = torch.Generator().manual_seed(21)
    x, weight = torch.randn(shape, generator=gen) * 3, torch.randn(shape[-1], generator=gen)
    x[0] = 0.0  # an all-zero row: only eps keeps it finite
    x, weight = x.to(device), weight.to(device)
    for got, twin, want in (
        (rms_norm(x, weight, EPS, "triton"), rms_norm_torch(x, weight, EPS), _definition(x, weight)),
        (rms_scale(x, EPS, "triton"), rms_scale_torch(x, EPS), _definition(x, None)),
    ):
        assert got.shape == x.shape and got.dtype == x.dtype and got.device == x.device
        assert (got - twin).abs().max().item() < 1e-5  # fp32 both: the row sum's order differs
        assert (got.double() - want).abs().max().item() < 1e-5
        assert torch.equal(got[0], torch.zeros_like(got[0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 needs a compiled kernel (the interpreter's is wrong)")
def test_rms_kernel_rounds_bf16_as_the_twin_does():
    """In bf16 the kernel and the twin round the same fp32 values (the scale, for ``rms_scale``, to
    bf16 before it multiplies): at most one bf16 step apart where the fp32 sums differ in order."""
    gen = torch.Generator().manual_seed(22)
    x = (torch.randn(64, 4, 512, generator=gen) * 3).to("cuda", torch.bfloat16)
    weight = torch.randn(512, generator=gen).to("cuda")
    for got, twin in (
        (rms_norm(x, weight, EPS, "triton"), rms_norm_torch(x, weight, EPS)),
        (rms_scale(x, EPS, "triton"), rms_scale_torch(x, EPS)),
    ):
        assert got.dtype == torch.bfloat16
        step = twin.float().abs() * 2.0**-7  # one bf16 step (8 significant bits) at the twin's value
        assert ((got.float() - twin.float()).abs() <= step).all()
        assert (got != twin).float().mean().item() < 0.01  # rarely even that
