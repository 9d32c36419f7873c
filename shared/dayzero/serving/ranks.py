"""What a worker does to its model and pools, done by every rank of its tensor-parallel group
in the same order.

Rank 0 alone talks to Celery and Redis: it admits, schedules, samples and publishes. Each
operation that changes the attention state or runs the model goes through ``Ranks``, which
first tells the other ranks (a ``dayzero.parallel.wire`` message: ids, token ids, patches and
state as tensors), then does it itself; the others, in ``follow``, do the same operation on
their own copy. The attention state is replicated (every rank holds all of it), so one rank's
pools are a sequence's whole state: a state imported on rank 0 (a handoff) is sent to the
others as its packed blocks, and groups of any sizes hand off to each other.

A failed collective (a rank died, or went silent past the group timeout) ends the process
(``on_group_failure``, by default exit code 4): the group cannot go on, its requests' leases
lapse and are re-run elsewhere, and the supervisor restarts the group. With one rank nothing
is sent and ``Ranks`` is a plain call.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from enum import IntEnum

import torch

from ..kv.handoff import export_state, import_state, warm_up_host_copy
from ..kv.pools import KVPools
from ..model.forward import decode
from ..model.graphs import DecodeGraphs
from ..model.plan import AttentionOptions
from ..model.weights import Transformer
from ..parallel.collectives import Group, GroupFailed
from ..parallel.wire import Message, receive, send
from ..sampling import PromptLogprobs
from ..telemetry import flush_spans
from .handoff import pack_state, unpack_state
from .prefill_batch import BatchInput, prefill_chunks

log = logging.getLogger("dayzero.ranks")

KEEPALIVE_S = 5.0  # an idle rank 0 still talks this often (at most): the others' waits stay within the timeout


class Op(IntEnum):
    STOP = 0
    KEEPALIVE = 1
    RESERVE = 2  # names [seq], ints [tokens]
    RELEASE = 3  # names [seq]
    ADOPT = 4  # names [seq], tensors [packed state]: rank 0 imported it from a handoff
    PREFILL = 5  # names [seqs], ints [n, (tokens, prompt length, images, echo top, after) per chunk, tokens...]
    DECODE = 6  # names [seqs], ints [input token per seq]
    COPY = 7  # names [source seq, copy]: the copy gets the source's state (identical prompts prefilled once)


def exit_group(exc: GroupFailed) -> None:
    log.critical("the tensor-parallel group failed (%s); exiting so that it restarts", exc)
    flush_spans()  # (os._exit runs no exit handlers: the spans still batched for export were dropped)
    logging.shutdown()
    os._exit(4)


class Ranks:
    def __init__(
        self,
        group: Group,
        model: Transformer,
        pools: KVPools,
        options: AttentionOptions,
        on_group_failure: Callable[[GroupFailed], None] = exit_group,
        keepalive_s: float = KEEPALIVE_S,
        decode_graphs: bool = False,
    ) -> None:
        self.group, self.model, self.pools, self.options = group, model, pools, options
        self.on_group_failure, self.keepalive_s = on_group_failure, keepalive_s
        self._told = time.monotonic()
        self.graphs = DecodeGraphs(model, pools, options) if decode_graphs else None

    def _decode(self, seq_ids: list[str], tokens: list[int]) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs.decode(seq_ids, tokens)
        return decode(self.model, self.pools, seq_ids, tokens, self.options)

    @property
    def size(self) -> int:
        return self.group.size

    def _tell(self, message: Message) -> None:
        if self.size > 1:
            self._guarded(send, self.group, message)
            self._told = time.monotonic()

    def _guarded(self, fn: Callable, *args):
        try:
            return fn(*args)
        except GroupFailed as exc:
            self.on_group_failure(exc)
            raise

    def reserve(self, seq_id: str, tokens: int) -> None:
        self.pools.reserve(seq_id, tokens)  # OutOfBlocks here: nothing to tell
        self._tell(Message(Op.RESERVE, [tokens], [seq_id]))

    def release(self, seq_id: str) -> None:
        if seq_id in self.pools.sequences:
            self.pools.release(seq_id)
            self._tell(Message(Op.RELEASE, names=[seq_id]))

    def adopt(self, seq_id: str) -> None:
        """``seq_id``'s state was just imported into rank 0's pools: the other ranks import it too."""
        if self.size > 1:
            packed = torch.frombuffer(bytearray(pack_state(self.pools, seq_id)), dtype=torch.uint8)
            self._tell(Message(Op.ADOPT, names=[seq_id], tensors=[packed]))

    def prefill(self, chunks: list[BatchInput]) -> list[torch.Tensor | None]:
        """One packed step of ``chunks`` (``prefill_chunks``): rank 0 decided which, the others run the same."""
        ints = [len(chunks)]
        for item in chunks:
            echo, after = item.echo.top if item.echo else -1, -1 if item.after is None else item.after
            ints += [len(item.tokens), len(item.prompt), int(item.images is not None), echo, after]
        ints += [t for item in chunks for t in item.tokens]
        images = [item.images for item in chunks if item.images is not None]
        self._tell(Message(Op.PREFILL, ints, [item.seq_id for item in chunks], images))
        return self._guarded(prefill_chunks, self.model, self.pools, chunks, self.options)

    def copy(self, source: str, seq_id: str) -> None:
        """``seq_id`` (reserved) gets ``source``'s state."""
        self._tell(Message(Op.COPY, names=[source, seq_id]))
        self._copy(source, seq_id)

    def _copy(self, source: str, seq_id: str) -> None:
        import_state(self.pools, self.pools, export_state(self.pools, source), seq_id)

    def decode(self, seq_ids: list[str], tokens: list[int]) -> torch.Tensor:
        self._tell(Message(Op.DECODE, list(tokens), list(seq_ids)))
        return self._guarded(self._decode, seq_ids, tokens)

    def keepalive(self) -> None:
        """Rank 0: a message when the others heard nothing for ``keepalive_s`` (a dead rank is
        found while idle too)."""
        if self.size > 1 and time.monotonic() - self._told >= self.keepalive_s:
            self._tell(Message(Op.KEEPALIVE))

    def stop(self) -> None:
        """Rank 0 is done: the others return from ``follow``."""
        self._tell(Message(Op.STOP))

    def follow(self) -> None:
        """Ranks 1..N-1: do what rank 0 says until it says stop. A failed collective (rank 0 gone, or
        silent past the group's timeout) ends this rank as it ends rank 0: ``on_group_failure``. The
        host pools' handoff copy is compiled first, as rank 0's warm-up compiles its own: the first
        state adopted or copied waited for it (1.7-12 s), and rank 0 with it."""
        warm_up_host_copy(self.pools)
        while (message := self._guarded(receive, self.group)).op != Op.STOP:
            try:
                self._guarded(self._do, message)
            except GroupFailed:
                raise
            except Exception:  # noqa: BLE001 - rank 0 met the same failure on the same inputs and went on
                log.exception("rank %d: %s failed", self.group.config.rank, Op(message.op).name)

    def _do(self, message: Message) -> None:
        op, names, ints = message.op, message.names, message.ints
        if op == Op.RESERVE:
            self.pools.reserve(names[0], ints[0])
        elif op == Op.RELEASE:
            self.pools.release(names[0])
        elif op == Op.ADOPT:
            src, handle = unpack_state(message.tensors[0].cpu().numpy().tobytes(), self.pools)
            import_state(self.pools, src, handle, names[0])
        elif op == Op.PREFILL:
            prefill_chunks(self.model, self.pools, _prefill_chunks(ints, names, message.tensors), self.options)
        elif op == Op.DECODE:
            self._decode(names, ints)
        elif op == Op.COPY:
            self._copy(names[0], names[1])


def _prefill_chunks(ints: list[int], names: list[str], images: list[torch.Tensor]) -> list[BatchInput]:
    n, patches = ints[0], iter(images)
    heads, tokens = ints[1 : 1 + 5 * n], ints[1 + 5 * n :]
    chunks, start = [], 0
    for i in range(n):
        length, prompt, has_images, echo, after = heads[5 * i : 5 * i + 5]
        row = tokens[start : start + length]
        start += length
        image = next(patches) if has_images else None
        echoed = PromptLogprobs(echo) if echo >= 0 else None
        chunks.append(BatchInput(names[i], row, image, echoed, prompt, after if after >= 0 else None))
    return chunks
