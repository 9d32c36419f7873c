"""What a byte-level tokenizer (GPT-2's byte alphabet, as DeepSeek's) guarantees: the most UTF-8
bytes one token can stand for, and the byte each character of its vocabulary writes; and a
byte-fallback tokenizer's byte tokens (sentencepiece's ``<0xE4>``, as Llama's and Mistral's)."""

from __future__ import annotations

import functools
import json
import re

from tokenizers import Tokenizer, pre_tokenizers

KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation"}  # split text, drop none of it


def max_token_bytes(tokenizer: Tokenizer) -> int | None:
    """The most UTF-8 bytes of text one token can stand for, when the tokenizer is lossless
    byte-level (then a text of B bytes has at least B / this many tokens); None otherwise.

    Byte-level: no normalizer, pre-tokenizers that split without dropping, ByteLevel's 256 byte
    characters all in the vocabulary, added tokens that absorb no neighbouring spaces. Then each
    byte of the text lands in exactly one token, written as one character of its vocabulary string
    (an added token as its own text), so no token stands for more bytes than its string has."""
    spec = json.loads(tokenizer.to_str())
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer") or {}
    splitters = pre.get("pretokenizers", [pre])
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    lossless = (
        (normalizer is None or normalizer.get("normalizers") == [])  # none, or an empty Sequence
        and "ByteLevel" in {p.get("type") for p in splitters}
        and all(p.get("type") in KEEPING_PRE_TOKENIZERS and p.get("behavior") != "Removed" for p in splitters)
        and all(c in vocab for c in pre_tokenizers.ByteLevel.alphabet())
        and not any(t.lstrip or t.rstrip for t in tokenizer.get_added_tokens_decoder().values())
    )
    return max(len(t.encode()) for t in vocab) if lossless else None


@functools.cache
def byte_level_values() -> dict[str, int]:
    """ByteLevel's vocabulary characters -> the bytes they write (GPT-2's table: printable bytes
    as themselves, the other bytes as the characters from U+0100 on, in byte order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(moved)}


def fallback_bytes(tokenizer: Tokenizer) -> dict[int, int]:
    """A byte-fallback tokenizer's byte tokens -> the byte each stands for: the ``<0xE4>`` tokens
    its ``ByteFallback`` decoder reads (a run of them decodes whole: its UTF-8, or one U+FFFD per
    byte where the run is not valid UTF-8); empty without that decoder."""
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    if "ByteFallback" not in {d.get("type") for d in decoder.get("decoders", [decoder])}:
        return {}
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return {i: int(piece[3:5], 16) for piece, i in vocab.items() if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece)}
