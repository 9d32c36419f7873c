"""``dayzero train-demo``: corpus -> tokenizer -> joint main + MTP training -> the release layout."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from .corpus import Split, split
from .data import documents, token_stream, train_tokenizer
from .loop import Losses, evaluate, train
from .model import TRAIN_CONFIG, DemoModel, build
from .options import TrainOptions


@dataclass(frozen=True, slots=True)
class Fitted:
    model: DemoModel
    tokenizer: Tokenizer
    corpus: Split
    train_losses: list[float]


def held_out_stream(tok: Tokenizer, corpus: Split) -> torch.Tensor:
    """The held-out pieces as plain documents, one token stream [N]."""
    return token_stream(tok, documents(corpus.held_out, chats=False))


def fit(opts: TrainOptions) -> Fitted:
    """Split the corpus, train the tokenizer on the training pieces, build and train the model."""
    corpus = split(opts.seed)
    tok = train_tokenizer(corpus.train, TRAIN_CONFIG["vocab_size"])
    stream = token_stream(tok, documents(corpus.train))
    print(
        f"corpus: {len(corpus.train)} training pieces ({stream.numel()} tokens), {len(corpus.held_out)} held out",
        file=sys.stderr,
    )
    model = build(TRAIN_CONFIG, opts.seed)
    history = train(model, stream, opts)
    return Fitted(model, tok, corpus, history)


def train_demo(out: str | Path, opts: TrainOptions, float_out: str | Path | None = None) -> tuple[Path, Losses]:
    """Train and write the checkpoint to ``out`` (and the float weights to ``float_out``); returns
    the checkpoint and the held-out losses of the trained (float) model."""
    from .export import export

    begin = time.monotonic()
    fitted = fit(opts)
    losses = evaluate(fitted.model, held_out_stream(fitted.tokenizer, fitted.corpus))
    path = export(fitted.model, fitted.tokenizer, Path(out), Path(float_out) if float_out else None)
    print(
        f"trained in {time.monotonic() - begin:.0f}s; held-out loss {losses.next:.3f} "
        f"(ppl {torch.tensor(losses.next).exp():.1f}), MTP t+2 loss {losses.after_next:.3f}, "
        f"top-1 {losses.mtp_top1:.3f}",
        file=sys.stderr,
    )
    return path, losses
