"""Decode steps replayed from CUDA graphs: one captured step per ``Bucket``.

A step of a bucket has the same ops, shapes and host values whatever its sequences (``Bucket``:
padding rows, tables and kernels sized for the bucket's longest sequence), so it is captured once,
on a plan of padding rows alone, and each step after copies its own plan into the captured plan's
tensors and replays the graph: the host launches one graph instead of a few dozen kernels a layer.

Off a GPU the runner re-runs the forward on the captured plan instead of a graph: what a replay
does (host values frozen at capture, tensors refreshed), which is how the CPU tests check that
nothing in a step reads host values of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..kv.pools import KVPools
from .forward import head, reserve_plan, run_layers
from .plan import AttentionOptions, Bucket, StepPlan, plan_step
from .vocab import lm_logits
from .weights import Transformer

PAD = "\0pad"  # the pools' sequence the padding rows write to


def refresh(captured: object, fresh: object) -> None:
    """Copy every tensor of plan ``fresh`` into the same place in ``captured`` (same shapes: a
    bucket's plans differ only in their tensors' contents; host values stay as captured)."""
    if isinstance(captured, torch.Tensor):
        if captured is not fresh:
            if captured.shape != fresh.shape or captured.dtype != fresh.dtype:
                raise ValueError(f"a bucket's plan changed shape: {tuple(captured.shape)} -> {tuple(fresh.shape)}")
            captured.copy_(fresh)
    elif dataclasses.is_dataclass(captured):
        for field in dataclasses.fields(captured):
            refresh(getattr(captured, field.name), getattr(fresh, field.name))
    elif isinstance(captured, dict):
        for key, value in captured.items():
            refresh(value, fresh[key])
    elif isinstance(captured, tuple | list):
        for mine, theirs in zip(captured, fresh, strict=True):
            refresh(mine, theirs)


def _capture(step: Callable[[], torch.Tensor], pool) -> Callable[[], torch.Tensor]:
    """``step`` as a CUDA graph (warmed up on a side stream first: Triton compiles, cuBLAS picks
    its kernels) -> a replay returning the graph's output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


class DecodeGraphs:
    """``forward.decode`` for the Triton backend, each step replayed from its bucket's graph
    (captured at a bucket's first step: ``least_tokens`` the shortest bucket)."""

    def __init__(self, model: Transformer, pools: KVPools, options: AttentionOptions, least_tokens: int = 1024) -> None:
        if options.backend != "triton":
            raise ValueError("decode graphs need the triton backend")
        self.model, self.pools, self.options, self.least_tokens = model, pools, options, least_tokens
        if PAD not in pools.sequences:  # its blocks take the padding rows' writes; never committed
            pools.reserve(PAD, max(model.cfg.compress_rates.values(), default=1) or 1)
        self.cuda = pools.device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self.cuda else None  # one memory pool for every graph
        self._steps: dict[Bucket, tuple[StepPlan, Callable[[], torch.Tensor]]] = {}

    def bucket(self, seq_ids: list[str]) -> Bucket:
        longest = max(self.pools.length(s) for s in seq_ids) + 1
        return Bucket.fitting(len(seq_ids), longest, PAD, self.least_tokens)

    @torch.inference_mode()
    def capture(self, bucket: Bucket) -> None:
        """Capture ``bucket``'s step, on a plan of padding rows alone (a warm-up may call this
        ahead of the first step that needs it)."""
        if bucket in self._steps:
            return
        blank = plan_step(self.model.cfg, self.pools, [], [], [], self.options, bucket)

        def step() -> torch.Tensor:
            return lm_logits(self.model, head(self.model, run_layers(self.model, blank, self.pools)))

        self._steps[bucket] = (blank, _capture(step, self._pool) if self.cuda else step)

    def capture_batches(self, most: int) -> None:
        """Capture the buckets of every batch size up to ``most`` sequences at the shortest length
        (a worker's warm-up: a bucket's first step would otherwise wait for its capture)."""
        for seqs in range(Bucket.fitting(most, 1, PAD).seqs.bit_length()):
            self.capture(Bucket(1 << seqs, self.least_tokens, PAD))

    @torch.inference_mode()
    def decode(self, seq_ids: list[str], tokens: list[int]) -> torch.Tensor:
        """One new token per sequence -> next-token logits [B, V] fp32, as ``forward.decode``."""
        bucket = self.bucket(seq_ids)
        self.capture(bucket)
        plan = reserve_plan(self.model, self.pools, seq_ids, [[t] for t in tokens], self.options, bucket)
        captured, replay = self._steps[bucket]
        refresh(captured, plan)
        logits = replay()[: len(seq_ids)].to(torch.float32, copy=True)  # the graph's output is overwritten
        for seq_id in seq_ids:
            self.pools.commit(seq_id, 1)
        return logits
