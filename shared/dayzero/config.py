"""Model hyperparameters: one frozen dataclass built from a DeepSeek-V4 ``config.json``.

Accepts what transformers' ``DeepseekV4Config`` accepts: explicit ``layer_types`` or the
per-layer ``compress_ratios`` list, ``compress_rates`` or the legacy scalar rates,
``mlp_layer_types`` or ``num_hash_layers``, and ``rope_parameters`` either nested
(``main`` / ``compress``) or flat (applied to the compressed layers only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_rope import RopeConfig, nested_rope_dim, parse_ropes
from .config_values import ConfigError
from .config_values import get_float as _float
from .config_values import get_int as _int
from .config_values import get_json as _json
from .config_values import get_value as _get

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
HASH_MOE, MOE = "hash_moe", "moe"
SCORING_FUNCS = ("sqrtsoftplus", "sigmoid", "softmax")
_FLAT_RATES = ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca"))  # the legacy scalar rates


@dataclass(frozen=True, slots=True)
class ModelConfig:
    # embedding / output
    vocab_size: int
    hidden_size: int
    num_layers: int
    rms_norm_eps: float
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    # attention
    num_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    layer_types: tuple[str, ...]
    compress_rates: dict[str, int] = field(hash=False)
    rope_main: RopeConfig = field(default_factory=lambda: RopeConfig(10000.0))
    rope_compress: RopeConfig = field(default_factory=lambda: RopeConfig(160000.0))
    # index
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    # hyper-connections
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    # moe
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 2048
    mlp_layer_types: tuple[str, ...] = ()
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    # multi-token prediction (DeepSeek's MTPBlock: one decoder block per predicted token)
    num_nextn_predict_layers: int = 0
    mtp_layer_type: str = SLIDING  # the trailing ``compress_ratios`` entry (0 in the releases)
    # raw config (kept to write checkpoints and to build references)
    raw: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    def defaulted_sizes(self) -> list[str]:
        """The keys that size tensors which config.json leaves out: each took transformers'
        default (V4-Flash's), so a tensor's shape, not the key, is the first thing to disagree."""
        return [key for key in SIZE_KEYS if self.raw.get(key) is None]

    def compress_rate(self, layer: int) -> int:
        """Tokens per compressed entry for ``layer`` (``num_layers`` and above: the MTP layers);
        0 for sliding-only layers."""
        kind = self.layer_type(layer)
        return 0 if kind == SLIDING else self.compress_rates[kind]

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if layer < self.num_layers else self.mtp_layer_type

    def hashed_moe(self, layer: int) -> bool:
        """Whether ``layer`` routes by token id; the MTP layers never do (they follow the hash layers)."""
        return layer < self.num_layers and self.mlp_layer_types[layer] == HASH_MOE

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        return _parse(raw)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        if not str(path):  # (Path("") is the working directory)
            raise ConfigError("an empty path: give a checkpoint directory or its config.json")
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"no config.json at {path}")
        if path.is_dir():  # (was "[Errno 21] Is a directory", exit 1: the host's fault; a FIFO is read as a file)
            raise ConfigError(f"{path} is not a file: give a checkpoint directory or its config.json")
        try:
            return _parse(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # (not UTF-8: a weights file given as the config)
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc


SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_groups",
    "o_lora_rank",
    "index_n_heads",
    "index_head_dim",
    "hc_mult",
    "n_routed_experts",
    "moe_intermediate_size",
)


def context_limit(cfg: ModelConfig, max_context: int | None) -> int:
    """Tokens a prompt plus its completion may take: DAYZERO_MAX_CONTEXT (``max_context``; None or 0:
    unset), never past the model's own context."""
    return min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)


def _ratio_types(raw: dict[str, Any], n: int, rates: dict[str, int]) -> list[str] | None:
    """``compress_ratios`` (each layer's compression rate: 0 sliding, the CSA rate, the HCA rate) as
    layer types: n entries, or n + 1 with the MTP layer's last (the releases)."""
    ratios = _json(raw, "compress_ratios", list)
    if ratios is None:
        return None
    if len(ratios) not in (n, n + 1):
        raise ConfigError(f"compress_ratios has {len(ratios)} entries; expected {n} (+1 for the MTP layer)")
    by_rate = {0: SLIDING, rates[CSA]: CSA, rates[HCA]: HCA}
    bad = [r for r in ratios if r not in by_rate]
    if bad:
        raise ConfigError(f"compress_ratios entries must be 0, {rates[CSA]} (CSA) or {rates[HCA]} (HCA); got {bad}")
    return [by_rate[r] for r in ratios]


def _layer_types(raw: dict[str, Any], n: int, rates: dict[str, int]) -> tuple[str, ...]:
    types = _json(raw, "layer_types", list)
    if types is None and (by_ratio := _ratio_types(raw, n, rates)) is not None:
        types = by_ratio[:n]
    if types is None:  # transformers' default: 2 HCA bootstrap layers, then CSA / HCA interleaved
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    types = list(types)[:n]
    if len(types) != n:
        raise ConfigError(f"layer_types has {len(types)} entries for num_hidden_layers={n}")
    bad = [t for t in types if t not in LAYER_TYPES]
    if bad:
        raise ConfigError(f"layer_types entries must be one of {LAYER_TYPES}; got {bad}")
    return tuple(types)


def _mtp_layer_type(raw: dict[str, Any], n: int, rates: dict[str, int]) -> str:
    types = _ratio_types(raw, n, rates)
    return types[n] if types is not None and len(types) > n else SLIDING


def _mlp_layer_types(raw: dict[str, Any], n: int) -> tuple[str, ...]:
    types = _json(raw, "mlp_layer_types", list)
    if types is None:
        n_hash = _int(raw, "num_hash_layers", 3, least=0)
        types = [HASH_MOE] * min(n, n_hash) + [MOE] * max(0, n - n_hash)
    types = list(types)[:n]
    bad = [t for t in types if t not in (HASH_MOE, MOE)]
    if bad or len(types) != n:
        raise ConfigError(f"mlp_layer_types must hold {n} entries of 'hash_moe' / 'moe'; got {types}")
    return tuple(types)


def _parse(raw: dict[str, Any]) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"must hold a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type != "deepseek_v4":
        raise ConfigError(f"model_type must be 'deepseek_v4', got {model_type!r}")
    n = _int(raw, "num_hidden_layers", 43)
    head_dim = _int(raw, "head_dim", 512)
    if raw.get("partial_rotary_factor") is not None:
        rope_head_dim = int(head_dim * _float(raw, "partial_rotary_factor", 1.0))
    elif raw.get("qk_rope_head_dim") is not None:
        rope_head_dim = _int(raw, "qk_rope_head_dim", None)
    else:  # transformers' default factor: 64 rope dims of a 512-wide head
        rope_head_dim = head_dim * 64 // 512
    rope_head_dim = nested_rope_dim(raw, head_dim, rope_head_dim)
    given = {CSA: 4, HCA: 128, **(_json(raw, "compress_rates", dict) or {})}
    given.update({kind: raw[key] for kind, key in _FLAT_RATES if raw.get(key) is not None})
    rates = {kind: _int(given, kind, None) for kind in (CSA, HCA)}
    eos = _get(raw, "eos_token_id", 1)
    max_pos = _int(raw, "max_position_embeddings", 1048576)
    rope_main, rope_compress = parse_ropes(raw, max_pos)
    cfg = ModelConfig(
        vocab_size=_int(raw, "vocab_size", 129280),
        hidden_size=_int(raw, "hidden_size", 4096),
        num_layers=n,
        rms_norm_eps=_float(raw, "rms_norm_eps", 1e-6),
        bos_token_id=raw.get("bos_token_id", 0),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (_int(raw, "eos_token_id", 1, least=0),),
        max_position_embeddings=max_pos,
        num_heads=_int(raw, "num_attention_heads", 64),
        head_dim=head_dim,
        rope_head_dim=rope_head_dim,
        q_lora_rank=_int(raw, "q_lora_rank", 1024),
        o_groups=_int(raw, "o_groups", 8),
        o_lora_rank=_int(raw, "o_lora_rank", 1024),
        sliding_window=_int(raw, "sliding_window", 128),
        layer_types=_layer_types(raw, n, rates),
        compress_rates=rates,
        rope_main=rope_main,
        rope_compress=rope_compress,
        index_n_heads=_int(raw, "index_n_heads", 64),
        index_head_dim=_int(raw, "index_head_dim", 128),
        index_topk=_int(raw, "index_topk", 512),
        hc_mult=_int(raw, "hc_mult", 4),
        hc_sinkhorn_iters=_int(raw, "hc_sinkhorn_iters", 20),
        hc_eps=_float(raw, "hc_eps", 1e-6),
        n_routed_experts=_int(raw, "n_routed_experts", 256),
        num_experts_per_tok=_int(raw, "num_experts_per_tok", 6),
        moe_intermediate_size=_int(raw, "moe_intermediate_size", 2048),
        mlp_layer_types=_mlp_layer_types(raw, n),
        scoring_func=str(_get(raw, "scoring_func", "sqrtsoftplus")),
        routed_scaling_factor=_float(raw, "routed_scaling_factor", 1.5),
        swiglu_limit=_float(raw, "swiglu_limit", 10.0),
        num_nextn_predict_layers=_int(raw, "num_nextn_predict_layers", 0, least=0),
        mtp_layer_type=_mtp_layer_type(raw, n, rates),
        raw=dict(raw),
    )
    _validate(cfg, raw)
    return cfg


def _validate(cfg: ModelConfig, raw: dict[str, Any]) -> None:
    indexed = {*cfg.layer_types, *([cfg.mtp_layer_type] if cfg.num_nextn_predict_layers else [])}  # (the indexer ropes)
    checks = [
        (cfg.scoring_func in SCORING_FUNCS, f"scoring_func {cfg.scoring_func!r} not in {SCORING_FUNCS}"),
        (_int(raw, "num_key_value_heads", 1) == 1, "only num_key_value_heads=1 (shared-KV MQA) exists in V4"),
        (_int(raw, "n_shared_experts", 1) == 1, "only n_shared_experts=1 is supported"),
        (cfg.rope_head_dim % 2 == 0 and 0 < cfg.rope_head_dim <= cfg.head_dim, "rope dim must be even, <= head_dim"),
        (CSA not in indexed or cfg.index_head_dim >= cfg.rope_head_dim, "index_head_dim must be >= the rope dim"),
        ((cfg.num_heads * cfg.head_dim) % cfg.o_groups == 0, "num_heads*head_dim must divide into o_groups"),
        (cfg.num_experts_per_tok <= cfg.n_routed_experts, "num_experts_per_tok > n_routed_experts"),
        (not raw.get("attention_bias") and not raw.get("mlp_bias"), "attention_bias / mlp_bias are not supported"),
        (str(_get(raw, "hidden_act", "silu")) == "silu", "only hidden_act='silu' is supported"),
        (not raw.get("tie_word_embeddings"), "tie_word_embeddings=true is not supported (V4 has its own head)"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
