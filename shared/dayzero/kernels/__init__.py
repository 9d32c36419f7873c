"""Kernels: tensors only. Each op is a Triton kernel, its torch twin (the spec) and one host
function that checks layouts and dispatches on ``backend`` ("torch" or "triton")."""

from .attention import CompressedKeys, DecodeWindow, sparse_attention_decode, sparse_attention_prefill
from .batch import Backend, RaggedBatch
from .compressor import compress_entries
from .indexer import indexer_topk
from .kv_write import write_window

__all__ = [
    "Backend",
    "CompressedKeys",
    "DecodeWindow",
    "RaggedBatch",
    "compress_entries",
    "indexer_topk",
    "sparse_attention_decode",
    "sparse_attention_prefill",
    "write_window",
]
