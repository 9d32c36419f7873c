"""What the gateway's routes share: settings, the bus, the tokenizer, metrics."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import version

import anyio
import anyio.to_thread

from dayzero.cgroups import usable_cpus
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.settings import Settings
from dayzero.tokenizer import InvalidTextError, PromptTooLongError, TextCodec

from .bus import Bus
from .error_fields import INVALID_UNICODE
from .errors import APIError
from .metrics import GatewayMetrics


@dataclass
class Gateway:
    settings: Settings
    bus: Bus
    codec: TextCodec | IdsOnlyCodec
    metrics: GatewayMetrics
    context_limit: int  # tokens a prompt plus its completion may take (config.context_limit)
    vocab_size: int
    image_token: int | None  # None: the checkpoint has no vision tower
    eos_token: int
    started: int = field(default_factory=lambda: int(time.time()))  # unix time; the model card's ``created``
    vision_config: dict = field(default_factory=dict)  # the checkpoint's: its patch geometry sizes the images
    fingerprint: str | None = None  # OpenAI's system_fingerprint (system_fingerprint())
    command_refused: str | None = None  # a command its Redis user is refused (NOPERM), met by the reaper: /ready's
    # long prompt texts and chats tokenized at once (``tokenizing_threads``): one a CPU this process may use (its
    # affinity, no more than its cgroup's CPU quota)
    tokenizing: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(usable_cpus()))


def system_fingerprint(config: dict, speculative_tokens: int) -> str:
    """OpenAI's ``system_fingerprint``: the backend a reply came from, dayzero's version, the
    checkpoint's config and the drafts per decode step (a change to any may change what a seed
    draws: speculation's accept-or-resample draws take the seed's randomness otherwise). A gateway
    that never drafts (0) hashes only the version and the config: its fingerprint is the one it had
    before the drafts were hashed, so clients comparing fingerprints see no change of backend."""
    drafts = [speculative_tokens] if speculative_tokens else []
    backend = json.dumps([version("dayzero"), config, *drafts], sort_keys=True, default=str)
    return "fp_" + hashlib.sha256(backend.encode()).hexdigest()[:12]


@contextlib.contextmanager
def tokenizing(param: str) -> Iterator[None]:
    """The tokenizer's refusals of prompt text as 400s naming ``param`` (messages, prompt)."""
    try:
        yield
    except InvalidTextError as exc:
        raise APIError(400, str(exc), param=param, code=INVALID_UNICODE) from None
    except PromptTooLongError as exc:
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None


# Prompt text up to this many characters is tokenized on the event loop: ~25 us for 100 characters,
# less than the thread pool's hop (~0.1 ms of CPU, and the wait for a pool thread and then for the
# loop); longer text off the loop (~0.2 ms per 1,000 characters, 2 ms per 10,000: the loop's other
# requests would wait).
ENCODED_ON_THE_LOOP = 256


# Text past this many characters (~10 ms to tokenize, and more) is tokenized on ``Gateway.tokenizing``'s
# threads, shorter text on the thread pool's, as the bus's hops are: with every text on the limiter, a
# prompt of 1,000 characters waited behind 40 long ones for them all (16 s; 2.9 s on the pool)
TOKENIZED_APART = 1 << 14


def tokenizing_threads(gw: Gateway, long: bool) -> anyio.CapacityLimiter | None:
    """``gw.tokenizing`` for long text (one thread a CPU: the rest wait their turn), else None (the
    thread pool's 40, which a long prompt would hold for seconds)."""
    return gw.tokenizing if long else None


async def encoded(gw: Gateway, text: str, limit: int | None, special: bool = True) -> list[int]:
    """``gw.codec.encode(text, limit, special)``, off the event loop unless ``text`` is short, long
    text on ``gw.tokenizing``'s threads (``tokenizing_threads``). Taking the thread pool's (40), 40
    long prompts at once (a second of CPU each) held it all: every request's own hops (the bus's
    Redis reads) waited seconds for a thread."""
    if len(text) <= ENCODED_ON_THE_LOOP:
        return gw.codec.encode(text, limit, special)
    threads = tokenizing_threads(gw, len(text) > TOKENIZED_APART)
    return await anyio.to_thread.run_sync(gw.codec.encode, text, limit, special, limiter=threads)
