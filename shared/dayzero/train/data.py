"""Token streams for training and evaluation, from the corpus split and the trained tokenizer.

Every piece is one document ``BOS text EOS``; the first piece of each topic is also framed as a
chat (its title as the user turn, the rest as the assistant's reply, in V4's own encoding), so
the served model answers a chat prompt with manual-like text.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from ..chat.encoding import encode_chat
from ..chat.tokens import BOS, EOS
from ..demo import build_tokenizer
from .corpus import Piece


def train_tokenizer(pieces: tuple[Piece, ...], vocab_size: int) -> Tokenizer:
    """Byte-level BPE on the training pieces; V4's special tokens keep ids 0.. (BOS 0, EOS 1)."""
    return build_tokenizer(vocab_size, [p.text for p in pieces])


def documents(pieces: tuple[Piece, ...], chats: bool = True) -> list[str]:
    """Each piece as plain text, plus (``chats``) the chat-framed first piece of each topic."""
    docs = [f"{BOS}{p.text}{EOS}" for p in pieces]
    for p in pieces if chats else ():
        title, _, body = p.text.partition("\n")
        if p.index == 0 and body.strip():
            docs.append(encode_chat([{"role": "user", "content": title}]) + body.lstrip("*\n") + EOS)
    return docs


def token_stream(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """All documents' ids, concatenated [N] int64 (special tokens are matched, no BOS added)."""
    ids = [i for enc in tok.encode_batch(docs, add_special_tokens=False) for i in enc.ids]
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows of ``length`` tokens [W, length] (the tail shorter than one dropped)."""
    count = stream.numel() // length
    return stream[: count * length].view(count, length)


def random_batch(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` windows of ``length`` tokens at random offsets [B, length]."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])
