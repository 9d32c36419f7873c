"""What a checkpoint's ``quantization_config`` declares, read once and checked.

The releases: ``{"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
"weight_block_size": [128, 128], "expert_dtype": "fp4", ...}``; ``expert_dtype`` may also sit at
the top level of config.json. Experts are ``fp4`` (MXFP4, kept packed), ``fp8`` (block-scaled,
dequantized at load, as the Base releases ship them) or unquantized (no quantization_config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXPERT_DTYPES = ("fp4", "fp8")


class QuantConfigError(ValueError):
    """A quantization_config dayzero cannot serve; the message names the field."""


@dataclass(frozen=True, slots=True)
class QuantSpec:
    expert_dtype: str | None  # "fp4" | "fp8" | None (float experts)
    block: tuple[int, int] = (128, 128)  # FP8 weight block (rows, cols)

    @property
    def packed_experts(self) -> bool:
        return self.expert_dtype == "fp4"


def quant_spec(raw: dict[str, Any]) -> QuantSpec:
    """The quantization of a config.json dict (``ModelConfig.raw``)."""
    q = raw.get("quantization_config")
    if not q:
        return QuantSpec(None)
    if q.get("quant_method") != "fp8":
        raise QuantConfigError(
            f"quantization_config quant_method {q.get('quant_method')!r} is not supported "
            "(supported: 'fp8', with FP4 or FP8 experts)"
        )
    if q.get("fmt", "e4m3") != "e4m3":
        raise QuantConfigError(f"quantization_config fmt {q.get('fmt')!r} is not supported (supported: 'e4m3')")
    if q.get("scale_fmt", "float") not in ("ue8m0", "float", None):
        raise QuantConfigError(f"quantization_config scale_fmt {q.get('scale_fmt')!r} is not supported")
    expert_dtype = q.get("expert_dtype", raw.get("expert_dtype", "fp8"))
    if expert_dtype not in EXPERT_DTYPES:
        raise QuantConfigError(f"expert_dtype {expert_dtype!r} is not supported (supported: {EXPERT_DTYPES})")
    block = q.get("weight_block_size") or [128, 128]
    if len(block) != 2 or min(block) < 1:
        raise QuantConfigError(f"quantization_config weight_block_size must be [rows, cols]; got {block}")
    return QuantSpec(expert_dtype, (int(block[0]), int(block[1])))
