"""In-process generation for one request: prefill, then decode until a finish condition."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from .kv.pools import KVPools
from .model.forward import decode, prefill
from .model.plan import AttentionOptions
from .model.weights import Transformer
from .sampling import SamplingParams, sample
from .tokenizer import StreamDecoder, TextCodec


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token and the text it released (may be empty while held back)."""

    token: int
    text: str
    finish_reason: str | None = None  # "stop" (EOS or stop string) | "length" | None


@dataclass(slots=True)
class Timings:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, float | int]:
        decode_steps = max(self.completion_tokens - 1, 0)  # the first token comes from prefill
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prefill_tokens_per_s": self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0,
            "decode_tokens_per_s": decode_steps / self.decode_seconds if self.decode_seconds else 0.0,
        }


class StopMatcher:
    """Releases text while holding back any suffix that could still become a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._pending = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        text = self._pending + delta
        hits = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._pending = ""
            return text[: min(hits)], True
        hold = max((k for s in self._stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return text


def generate(
    model: Transformer,
    codec: TextCodec,
    pools: KVPools,
    prompt: list[int],
    params: SamplingParams,
    timings: Timings | None = None,
    max_context: int | None = None,
    options: AttentionOptions = AttentionOptions(),
) -> Iterator[Step]:
    """Stream the completion of ``prompt``; the last step carries the finish reason.

    The request's attention state lives in ``pools`` while it runs and is released after.
    """
    cfg = model.cfg
    limit = min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) >= limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the context limit is {limit}")
    timings = timings if timings is not None else Timings()
    timings.prompt_tokens = len(prompt)
    seq = [uuid.uuid4().hex]
    try:
        yield from _run(model, codec, pools, seq, prompt, params, timings, limit, options)
    finally:
        pools.release(seq[0])


def _run(
    model: Transformer,
    codec: TextCodec,
    pools: KVPools,
    seq: list[str],
    prompt: list[int],
    params: SamplingParams,
    timings: Timings,
    limit: int,
    options: AttentionOptions,
) -> Iterator[Step]:
    cfg = model.cfg
    generator, text, stops = params.generator(), StreamDecoder(codec), StopMatcher(params.stop)
    start = time.perf_counter()
    logits = prefill(model, pools, seq, [prompt], options)[0]
    timings.prefill_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for n in range(1, params.max_tokens + 1):
        token = sample(logits, params, generator)
        timings.completion_tokens = n
        if token in cfg.eos_token_ids and not params.ignore_eos:
            yield Step(token, stops.flush(), "stop")
            break
        released, stopped = stops.feed(text.push(token))
        if stopped:
            yield Step(token, released, "stop")
            break
        if n == params.max_tokens or pools.length(seq[0]) + 1 >= limit:
            yield Step(token, released + stops.flush(), "length")
            break
        yield Step(token, released)
        logits = decode(model, pools, seq, [token], options)[0]
    timings.decode_seconds = time.perf_counter() - start
