"""The weight check every worker runs after loading: a sample of every quantized tensor decodes sanely.

A checkpoint can load without an error and still compute garbage: E8M0 scales converted by
value instead of by their bits become 0 (2^-127) and switch every routed expert off. So each
packed expert matrix (w1, w2, w3 of every MoE layer, MTP included) has a few of its experts
decoded: no NaN scale (0xFF), finite values, and not all (nearly) zero. FP8 dense weights are
checked as they are dequantized at load (``dequant_fp8``). A failure refuses the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .experts import PackedExperts
from .formats import dequant_mxfp4

# a scale byte below this is 2^-100 or less: no trained weight is that small, but a value
# conversion of E8M0 scales (2^-7 -> 0 -> 2^-127) makes every one of them so
NEGLIGIBLE_SCALE_BYTE = 27
SAMPLES = 3  # experts decoded per matrix: the first, the middle, the last


class WeightCheckError(ValueError):
    """A quantized tensor that does not decode to usable weights; the message names it."""


@dataclass(frozen=True, slots=True)
class WeightCheck:
    fp8_tensors: int  # dense FP8 weights checked while dequantized
    expert_matrices: int  # packed expert matrices sampled
    experts_decoded: int

    @property
    def tensors(self) -> int:
        return self.fp8_tensors + self.expert_matrices

    def summary(self) -> str:
        return (
            f"{self.tensors} quantized tensors checked ({self.fp8_tensors} FP8 dense, {self.expert_matrices} FP4 "
            f"expert matrices, {self.experts_decoded} experts decoded): scales finite powers of two, none all zero"
        )


def _check_expert(name: str, packed: torch.Tensor, scales: torch.Tensor) -> None:
    if (scales == 255).any():
        raise WeightCheckError(f"{name}: a scale is 0xFF (NaN in E8M0)")
    if int(scales.max()) < NEGLIGIBLE_SCALE_BYTE:
        raise WeightCheckError(
            f"{name} decodes to (nearly) all zeros: every scale is 2^{int(scales.max()) - 127} or less "
            "(E8M0 scales converted by value instead of reinterpreted?)"
        )
    values = dequant_mxfp4(packed, scales, name)
    if not torch.isfinite(values).all():
        raise WeightCheckError(f"{name} decodes to non-finite values")
    if not values.abs().amax() > 0:
        raise WeightCheckError(f"{name} decodes to all zeros")


def check_experts(prefix: str, experts: PackedExperts) -> tuple[int, int]:
    """Samples of each packed matrix of one MoE layer; (matrices, experts decoded)."""
    n = experts.w1.shape[0]
    ids = sorted({0, n // 2, n - 1})[:SAMPLES]
    for matrix in ("w1", "w2", "w3"):
        packed, scales = getattr(experts, matrix), getattr(experts, f"{matrix}_scale")
        for e in ids:
            _check_expert(f"{prefix}.experts.{e}.{matrix}", packed[e], scales[e])
    return 3, 3 * len(ids)


def check_weights(model: torch.nn.Module, fp8_tensors: int) -> WeightCheck:
    """Every packed-expert layer of ``model`` (main and MTP layers) sampled; raises WeightCheckError."""
    matrices = decoded = 0
    for name, module in model.named_modules():
        if isinstance(module, PackedExperts):
            m, d = check_experts(name.removesuffix(".experts"), module)
            matrices, decoded = matrices + m, decoded + d
    return WeightCheck(fp8_tensors, matrices, decoded)
