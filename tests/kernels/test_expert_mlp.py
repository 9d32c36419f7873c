"""Both expert formats run the same MLP: MXFP4 through the grouped matmul equals the dequantized
weights through a plain per-expert loop, and both equal a hand-written SwiGLU on one row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dayzero.kernels.expert_mlp import expert_mlp, expert_mlp_stacked, pads_cheaply, swiglu_torch
from dayzero.kernels.moe import expert_mlp_mxfp4, swiglu
from dayzero.quant.formats import dequant_mxfp4, quant_mxfp4

LIMIT = 7.0


def _packed(experts: int, hidden: int, inter: int) -> dict[str, torch.Tensor]:
    gen, out = torch.Generator().manual_seed(0), {}
    for name, shape in {"w1": (inter, hidden), "w2": (hidden, inter), "w3": (inter, hidden)}.items():
        codes, scales = zip(*(quant_mxfp4(torch.randn(shape, generator=gen)) for _ in range(experts)), strict=True)
        out[name], out[f"{name}_scale"] = torch.stack(codes), torch.stack(scales)
    return out


def test_the_grouped_mxfp4_path_equals_the_dequantized_per_expert_path():
    packed = _packed(experts=4, hidden=64, inter=32)
    float_w = {
        e: tuple(dequant_mxfp4(packed[n][e], packed[f"{n}_scale"][e]) for n in ("w1", "w2", "w3")) for e in range(4)
    }
    counts = torch.tensor([3, 0, 1, 2])  # an expert with no rows
    xs = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    loop = expert_mlp(xs, counts.tolist(), lambda ids: {e: float_w[e] for e in ids}, LIMIT)
    grouped = expert_mlp_mxfp4(xs, counts, 3, packed, LIMIT, "torch")
    assert torch.allclose(loop, grouped, atol=1e-4, rtol=1e-4)  # fp32, different summation order

    w1, w2, w3 = float_w[2]  # row 3 belongs to expert 2: the MLP by hand
    x = xs[3]
    by_hand = w2 @ (F.silu((w1 @ x).clamp(max=LIMIT)) * (w3 @ x).clamp(-LIMIT, LIMIT))
    assert torch.allclose(loop[3], by_hand, atol=1e-5)


def test_the_stacked_path_equals_the_per_expert_loop():
    gen = torch.Generator().manual_seed(2)
    w1, w3 = torch.randn(4, 32, 64, generator=gen), torch.randn(4, 32, 64, generator=gen)
    w2 = torch.randn(4, 64, 32, generator=gen)
    counts = torch.tensor([3, 1, 5, 2])  # uneven: three experts padded to the busiest's five rows
    xs = torch.randn(11, 64, generator=gen)
    loop = expert_mlp(xs, counts.tolist(), lambda ids: {e: (w1[e], w2[e], w3[e]) for e in ids}, LIMIT)
    stacked = expert_mlp_stacked(xs, counts, 5, w1, w2, w3, LIMIT)
    assert torch.allclose(stacked, loop, atol=1e-4, rtol=1e-5)  # fp32, batched vs plain matmul blocking
    x = xs[3]  # expert 1's one row (after expert 0's three): the MLP by hand
    by_hand = w2[1] @ (F.silu((w1[1] @ x).clamp(max=LIMIT)) * (w3[1] @ x).clamp(-LIMIT, LIMIT))
    assert torch.allclose(stacked[3], by_hand, atol=1e-4, rtol=1e-5)


def test_padding_is_taken_only_when_every_expert_has_rows_and_it_is_cheap():
    assert pads_cheaply([4, 3, 5, 4], inter=32, hidden=64)  # a decode step of a small model
    assert not pads_cheaply([4, 0, 5, 4], inter=32, hidden=64)  # an idle expert's weights multiplied
    assert not pads_cheaply([40, 3, 50, 4], inter=2048, hidden=4096)  # padding a large expert costs more


def test_the_swiglu_kernel_matches_the_twin_and_the_definition(device):
    """silu(min(gate, limit)) * clamp(up, -limit, limit) elementwise, one launch (the grouped
    path's and the shared expert's), over more elements than one program takes, values past the
    limit on both sides included."""

    gen = torch.Generator().manual_seed(3)
    gate, up = torch.randn(3, 1500, generator=gen) * 6, torch.randn(3, 1500, generator=gen) * 6
    got = swiglu(gate.to(device), up.to(device), LIMIT, "triton").cpu()
    assert got.shape == gate.shape and (got - swiglu_torch(gate, up, LIMIT)).abs().max().item() < 1e-5
    g = gate.double().clamp(max=LIMIT)
    by_hand = g / (1 + torch.exp(-g)) * up.double().clamp(-LIMIT, LIMIT)
    assert (got.double() - by_hand).abs().max().item() < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 needs a compiled kernel (the interpreter's is wrong)")
def test_the_swiglu_kernel_rounds_bf16_as_the_twin_does():
    gen = torch.Generator().manual_seed(4)
    gate, up = ((torch.randn(64, 2048, generator=gen) * 6).to("cuda", torch.bfloat16) for _ in range(2))
    got, twin = swiglu(gate, up, LIMIT, "triton"), swiglu_torch(gate, up, LIMIT)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - twin.float()).abs() <= twin.float().abs() * 2.0**-7 + 1e-6).all()
