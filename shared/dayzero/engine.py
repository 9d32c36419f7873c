"""In-process generation for one request: prefill, then decode until the completion ends."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from .completion import Completion, Step
from .config import context_limit
from .kv.pools import KVPools
from .model.forward import decode, prefill
from .model.plan import AttentionOptions
from .model.weights import Transformer
from .sampling import SamplingParams
from .speculative import Acceptance, Speculation, speculative_step
from .tokenizer import TextCodec


@dataclass(slots=True)
class Timings:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    acceptance: Acceptance | None = None  # with speculative decoding

    def summary(self) -> dict[str, float | int | list[float]]:
        decode_steps = max(self.completion_tokens - 1, 0)  # the first token comes from prefill
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prefill_tokens_per_s": self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0,
            "decode_tokens_per_s": decode_steps / self.decode_seconds if self.decode_seconds else 0.0,
        } | (self.acceptance.summary() if self.acceptance is not None else {})


def generate(
    model: Transformer,
    codec: TextCodec,
    pools: KVPools,
    prompt: list[int],
    params: SamplingParams,
    timings: Timings | None = None,
    max_context: int | None = None,
    options: AttentionOptions = AttentionOptions(),
    speculation: Speculation | None = None,
) -> Iterator[Step]:
    """Stream the completion of ``prompt``; the last step carries the finish reason.

    The request's attention state lives in ``pools`` while it runs and is released after.
    ``speculation``: draft with the MTP layer (the pools must hold its state).
    """
    limit = context_limit(model.cfg, max_context)
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) >= limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the context limit is {limit}")
    timings = timings if timings is not None else Timings()
    timings.prompt_tokens = len(prompt)
    seq = uuid.uuid4().hex
    completion = Completion(codec, params, model.cfg.eos_token_ids, len(prompt), limit, prompt_ids=prompt)
    try:
        start = time.perf_counter()
        logits = prefill(model, pools, [seq], [prompt], options)[0]
        timings.prefill_seconds = time.perf_counter() - start
        start = time.perf_counter()
        steps = [completion.next(logits)]
        if speculation is not None:
            timings.acceptance = Acceptance()
        while True:
            timings.completion_tokens = completion.count
            yield from steps
            if steps[-1].finish_reason:
                break
            steps = _advance(model, pools, seq, completion, steps[-1].token, options, speculation, timings)
        timings.decode_seconds = time.perf_counter() - start
    finally:
        pools.release(seq)


def _advance(
    model: Transformer,
    pools: KVPools,
    seq: str,
    completion: Completion,
    token: int,
    options: AttentionOptions,
    speculation: Speculation | None,
    timings: Timings,
) -> list[Step]:
    """Feed ``token``: the next step (plain decode), or the steps of one speculative round."""
    if speculation is None:
        return [completion.next(decode(model, pools, [seq], [token], options)[0])]
    outcome = speculative_step(model, pools, [seq], [token], [completion], speculation, options)[0]
    if timings.acceptance is not None:
        timings.acceptance.add(outcome)
    steps = []
    for step in outcome.steps:
        if isinstance(step, Exception):
            raise step
        steps.append(step)
    return steps
