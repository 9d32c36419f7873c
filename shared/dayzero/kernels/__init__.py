"""Kernels: tensors only. Each op is a Triton kernel, its torch twin (the spec) and one host
function that checks layouts and dispatches on ``backend`` ("torch" or "triton").

The names below are imported on first use (PEP 562): a caller that plans without running, such
as ``dayzero inspect``, imports a kernel module it needs without triton and numba coming with
every other."""

from __future__ import annotations

import importlib

_MODULE_OF = {
    "Backend": "batch",
    "CompressedKeys": "attention",
    "DecodeWindow": "attention",
    "RaggedBatch": "batch",
    "compress_entries": "compressor",
    "expert_mlp_mxfp4": "moe",
    "indexer_topk": "indexer",
    "sparse_attention_decode": "attention",
    "sparse_attention_prefill": "attention",
    "write_window": "kv_write",
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> object:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
