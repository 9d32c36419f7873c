"""Embedding and output head, split by vocabulary rows over the model's ranks.

A rank holds rows ``[r*V/N, (r+1)*V/N)`` of ``embed`` and ``head``: token ids outside them
embed to zero rows and the ranks' rows are summed; each rank's logits cover its vocabulary
rows and are gathered in rank order. One rank: a plain lookup and a plain linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .weights import Transformer


def embed_tokens(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """ids [T] long -> [T, hidden]."""
    comm = model.comm
    if comm.size == 1:
        return model.embed(ids)
    start, stop = comm.config.span(model.cfg.vocab_size)
    inside = (ids >= start) & (ids < stop)
    rows = model.embed((ids - start).clamp(0, stop - start - 1)) * inside[:, None]
    return comm.all_reduce_sum(rows)


def lm_logits(model: Transformer, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [T, hidden] -> logits [T, V] in the head's dtype."""
    return model.comm.all_gather(F.linear(hidden, model.head.weight), dim=-1)
