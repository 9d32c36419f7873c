"""Rank 0's messages to the other ranks of its group, as tensors (never pickles: a rank runs
what it is told, not code it is sent).

A ``Message`` is an operation code, a list of integers, a list of names (request ids) and a
list of tensors. On the wire: a fixed header [op, integers, name bytes, tensors], then one
int64 body (the integers, each tensor's dtype and shape, the names' UTF-8 bytes, NUL between
them), then each tensor's bytes. Two broadcasts carry a message without tensors (a decode
step's plan: its sequence ids and input tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .collectives import Group

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.int8)
MAX_DIMS = 4
DESCRIPTOR = 2 + MAX_DIMS  # dtype index, dimensions, sizes (padded with zeros)


@dataclass(frozen=True, slots=True)
class Message:
    op: int
    ints: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)


def _descriptor(t: torch.Tensor) -> list[int]:
    if t.dtype not in DTYPES or t.dim() > MAX_DIMS:
        raise ValueError(f"cannot send a {t.dtype} tensor of {t.dim()} dimensions")
    return [DTYPES.index(t.dtype), t.dim(), *t.shape, *[0] * (MAX_DIMS - t.dim())]


def send(group: Group, message: Message) -> None:
    """Rank 0: broadcast ``message`` to the other ranks (each is waiting in ``receive``)."""
    names = "\0".join(message.names).encode() if message.names else b""
    body = [*message.ints, *(d for t in message.tensors for d in _descriptor(t)), *names]
    header = [message.op, len(message.ints), len(names), len(message.tensors)]
    group.broadcast(torch.tensor(header, dtype=torch.int64, device=group.device))
    if body:
        group.broadcast(torch.tensor(body, dtype=torch.int64, device=group.device))
    for t in message.tensors:
        group.broadcast(t.detach().to(group.device).contiguous().view(-1).view(torch.uint8))


def receive(group: Group) -> Message:
    """The other ranks: the next message rank 0 sends."""
    header = group.broadcast(torch.empty(4, dtype=torch.int64, device=group.device)).tolist()
    op, n_ints, n_bytes, n_tensors = header
    size = n_ints + n_tensors * DESCRIPTOR + n_bytes
    body = group.broadcast(torch.empty(size, dtype=torch.int64, device=group.device)).tolist() if size else []
    ints, rest = body[:n_ints], body[n_ints:]
    descriptors = [rest[i * DESCRIPTOR : (i + 1) * DESCRIPTOR] for i in range(n_tensors)]
    text = bytes(rest[n_tensors * DESCRIPTOR :]).decode()
    tensors = []
    for dtype_index, dims, *sizes in descriptors:
        dtype, shape = DTYPES[dtype_index], sizes[:dims]
        raw = torch.empty(math.prod(shape) * dtype.itemsize, dtype=torch.uint8, device=group.device)
        tensors.append(group.broadcast(raw).view(dtype).view(shape))
    return Message(op, ints, text.split("\0") if n_bytes else [], tensors)
