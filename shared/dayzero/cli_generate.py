"""``dayzero generate``: one prompt through the engine in this process, or over tensor-parallel
ranks (spawned here, or started by torchrun); and the prompt options it shares with ``align``."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from pathlib import Path

from .config import ModelConfig, context_limit
from .params import sampler_seed
from .settings import Settings

DEFAULT_MAX_TOKENS = 64  # --max-tokens left out, where the limit and the context leave that many


def _ids(text: str) -> list[int]:
    items = [t for t in (t.strip() for t in text.split(",")) if t]
    if not all(re.fullmatch(r"-?[0-9]+", t) for t in items):  # "1 2" is no 12, nor "1_0" 10 (int() takes both)
        raise ValueError(f"--prompt-ids takes comma-separated integers, got {text!r}")
    if not items:
        raise ValueError("--prompt-ids is empty")
    return [int(t) for t in items]


def _option(field: re.Match) -> str:
    return "--" + field[1].replace("_", "-")


def prompt_of(args: argparse.Namespace, checkpoint: Path) -> list[int]:
    """The prompt's ids, each checked against the checkpoint's vocabulary."""
    from .tokenizer import load_codec

    vocab = ModelConfig.from_file(checkpoint).vocab_size  # first: a directory without one is named so
    ids = _ids(args.prompt_ids) if args.prompt_ids is not None else load_codec(checkpoint).encode(args.prompt)
    outside = [t for t in ids if not 0 <= t < vocab]
    if outside:
        raise ValueError(f"token id {outside[0]} is outside the vocabulary [0, {vocab})")
    return ids


def _room(prompt_tokens: int, max_tokens: int | None, cfg: ModelConfig, settings: Settings) -> int:
    """``--max-tokens`` as the API takes ``max_tokens``: one past DAYZERO_MAX_TOKENS_LIMIT, or past the
    context after the prompt, refused in its words (it ran on, silently, to the end of the context);
    left out, 64 or what the limit and the context leave (as the API's default, which fills them)."""

    limit = context_limit(cfg, settings.max_context)
    if max_tokens is None:  # (a prompt without room: the engine's "the prompt has N tokens; the context ...")
        return max(1, min(DEFAULT_MAX_TOKENS, settings.max_tokens_limit, limit - prompt_tokens))
    if max_tokens > settings.max_tokens_limit:
        raise ValueError(
            f"--max-tokens {max_tokens} exceeds the limit {settings.max_tokens_limit} (DAYZERO_MAX_TOKENS_LIMIT)"
        )
    if prompt_tokens + max_tokens > limit:
        raise ValueError(f"prompt ({prompt_tokens}) + --max-tokens ({max_tokens}) exceeds the context limit {limit}")
    return max_tokens


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from .checkpoint import check_split
    from .checkpoint_files import checkpoint_directory
    from .parallel.group import run_group
    from .parallel.launch import launch_from
    from .sampling import SamplingParams
    from .tokenizer import load_codec

    settings.require_device()
    checkpoint = checkpoint_directory(args.checkpoint or settings.checkpoint_dir())
    if args.tensor_parallel > 1:
        check_split(checkpoint, [args.tensor_parallel])  # before any rank starts
    prompt = prompt_of(args, checkpoint)
    max_tokens = _room(len(prompt), args.max_tokens, ModelConfig.from_file(checkpoint), settings)
    if args.stop and not load_codec(checkpoint).has_tokenizer:
        raise ValueError("--stop needs text, and this checkpoint has no tokenizer.json")
    launch = launch_from(os.environ, settings.device)  # torchrun's variables, if set
    seed = None if args.seed is None else sampler_seed(args.seed)  # as the API reduces it
    if seed is None and launch is not None and args.temperature > 0:  # no way to agree on a random one
        raise ValueError("ranks started by torchrun sample alike only with one --seed: pass --seed")
    if seed is None and args.tensor_parallel > 1:  # every rank samples alike from the same logits
        seed = random.randrange(1 << 31)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=seed,
            stop=tuple(args.stop),
        )
    except ValueError as exc:  # the contract names its fields: here they are options
        raise ValueError(re.sub(r"\b(max_tokens|temperature|top_p|top_k|seed|stop)\b", _option, str(exc))) from None
    if args.speculative_tokens is not None:
        settings = settings.model_copy(update={"speculative_tokens": args.speculative_tokens})
    tp, timeout = args.tensor_parallel, args.group_timeout
    run_group(
        tp,
        _generate_on,
        checkpoint,
        prompt,
        params,
        settings,
        args.stats,
        timeout=timeout,
        launch=launch,
        device=settings.device,
    )
    return 0


def _generate_on(group, checkpoint: Path, prompt: list[int], params, settings: Settings, stats: bool) -> None:
    """One rank's generation (all ranks compute the same tokens; rank 0 prints them)."""
    from .checkpoint import load_model
    from .engine import Timings, generate
    from .kv.pools import pools_for
    from .model.plan import AttentionOptions
    from .serving.budget import torch_dtype
    from .speculative import Speculation
    from .speculative_checks import speculation_problem
    from .tokenizer import load_codec

    codec, printing = load_codec(checkpoint), group.config.rank == 0
    model = load_model(
        checkpoint,
        torch_dtype(settings),
        group.device,
        progress=printing,
        expert_cache_bytes=settings.expert_cache_mb << 20,
        group=group,
    )
    context, k = context_limit(model.cfg, settings.max_context), settings.speculative_tokens
    if k and (problem := speculation_problem(model.cfg, len(model.mtp), k)):
        raise ValueError(f"--speculative-tokens {problem}")
    pools = pools_for(model.cfg, torch_dtype(settings), context, mtp=k > 0, device=group.device)
    timings, speculation = Timings(), Speculation(k) if k else None
    options = AttentionOptions.of(settings)
    steps = generate(model, codec, pools, prompt, params, timings, settings.max_context, options, speculation)
    for i, step in enumerate(steps):  # text, or the ids when the checkpoint has no tokenizer
        if printing:
            sys.stdout.write(step.text if codec.has_tokenizer else f"{',' if i else ''}{step.token}")
            sys.stdout.flush()
    if printing:
        sys.stdout.write("\n")
        if stats:
            print(json.dumps(timings.summary()))
