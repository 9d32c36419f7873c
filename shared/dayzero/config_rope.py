"""RoPE settings of a DeepSeek-V4 config.json: ``rope_parameters`` nested (``main`` / ``compress``)
or flat (applied to the compressed layers only), default or YaRN, as transformers reads them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .config_values import ConfigError
from .config_values import get_float as _float
from .config_values import get_int as _int
from .config_values import get_json as _json

ROPE_TYPES = ("default", "yarn")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


def _rope(params: dict[str, Any], theta: float, max_pos: int, nested: bool = False) -> RopeConfig:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"rope_type {rope_type!r} is not supported (supported: {ROPE_TYPES})")
    theta = _float(params, "rope_theta", theta)
    if rope_type == "default":
        return RopeConfig(theta)
    original = _int(params, "original_max_position_embeddings", None)
    factor = _float(params, "factor", max_pos / original)
    # transformers forces attention_factor 1.0 on the flat form only; nested, it derives one when absent
    attention = params.get("attention_factor")
    if attention is None:
        attention = _yarn_mscale(params, factor) if nested else 1.0
    if attention != 1.0:
        raise ConfigError(
            f"yarn attention_factor {attention:.6g} is not supported (V4 does not scale cos/sin; nested "
            "rope_parameters without attention_factor derive it from factor / mscale): set attention_factor 1.0"
        )
    return RopeConfig(
        theta,
        "yarn",
        factor,
        original,
        _float(params, "beta_fast", 32.0),
        _float(params, "beta_slow", 1.0),
        bool(params.get("truncate", True)),
    )


def _yarn_mscale(params: dict[str, Any], factor: float) -> float:
    """The attention factor transformers derives for yarn without one (``_compute_yarn_parameters``)."""

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    return mscale(m) / mscale(m_all) if m and m_all else mscale()


def parse_ropes(raw: dict[str, Any], max_pos: int) -> tuple[RopeConfig, RopeConfig]:
    rp = _json(raw, "rope_parameters", dict) or _json(raw, "rope_scaling", dict) or {}
    main_theta = _float(raw, "rope_theta", 10000.0)
    compress_theta = _float(raw, "compress_rope_theta", 160000.0)
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        return _rope(rp["main"], main_theta, max_pos, True), _rope(rp["compress"], compress_theta, max_pos, True)
    flat = {k: v for k, v in rp.items() if k not in ("main", "compress", "rope_theta")}
    return RopeConfig(main_theta), _rope(flat, compress_theta, max_pos)


def nested_rope_dim(raw: dict[str, Any], head_dim: int, flat_dim: int) -> int:
    """Nested ``rope_parameters`` size each rotation by their own ``partial_rotary_factor``
    (transformers fills a missing one from the top-level key, else 1.0); dayzero has one rope dim."""
    rp = _json(raw, "rope_parameters", dict) or {}
    if not (isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict)):
        return flat_dim
    fallback = _float(raw, "partial_rotary_factor", 1.0)
    main, compress = (
        int(head_dim * _float(rp[kind], "partial_rotary_factor", fallback)) for kind in ("main", "compress")
    )
    if main != compress:
        raise ConfigError(
            f"rope_parameters rotate {main} (main) and {compress} (compress) dims of each head "
            "(their partial_rotary_factor); dayzero supports one rope dim for both"
        )
    return main
