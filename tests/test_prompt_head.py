"""A long prompt is refused from its head's tokens when those alone pass the limit: only the head is
tokenized (the demo tokenizer: byte-level BPE, GPT-style pre-tokenizing regex)."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from dayzero.demo import write_demo_checkpoint
from dayzero.prompt_head import HEAD_CHARACTERS_PER_TOKEN, _word_end, tokens_of_head
from dayzero.tokenizer import PromptTooLongError, TextCodec

LIMIT = 256
HEAD = LIMIT * HEAD_CHARACTERS_PER_TOKEN


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    return TextCodec.from_checkpoint(write_demo_checkpoint(tmp_path_factory.mktemp("demo")))


@pytest.fixture
def encoded(codec, monkeypatch):
    """The lengths of the texts the tokenizer was given."""
    given, encode = [], codec._tok.encode_batch_fast

    class Counting:
        def __getattr__(self, name):
            return getattr(codec._tok.__wrapped__, name)

        def encode_batch_fast(self, texts, **kw):
            given.extend(len(t) for t in texts)
            return encode(texts, **kw)

    counting = Counting()
    counting.__dict__["__wrapped__"] = codec._tok
    monkeypatch.setattr(codec, "_tok", counting)
    return given


def test_a_prompt_past_the_limit_is_refused_from_its_head(codec, encoded, monkeypatch):
    """Under its byte bound it was tokenized whole (6,000 characters: 6,001 tokens) to be refused; now
    its head alone is (2,048 characters), and the error still says at least how many."""
    # a model token of 64 bytes (as a real vocabulary's run of "="): 6,000 bytes prove 94 tokens
    monkeypatch.setattr(codec, "token_bytes", dataclasses.replace(codec.token_bytes, plain=64))
    text = "<x " * 2_000
    with pytest.raises(PromptTooLongError) as refused:
        codec.encode(text, LIMIT)
    assert encoded and max(encoded) <= HEAD < len(text), encoded
    assert LIMIT <= refused.value.tokens <= len(codec.encode(text)), refused.value.tokens


PIECES = ["word", " ", "  ", "\n", "\n\n", "123456", "中文字符", "🙂", ",.;", "<｜User｜>", "é", "x" * 40, "\t"]


@pytest.mark.parametrize("seed", range(20))
def test_the_head_never_counts_more_than_the_whole_text_has(codec, seed):
    """What the head proves is a lower bound: never past the whole text's own count (random texts of
    words, spaces, newlines, digits, CJK, emoji, special tokens)."""
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(3_000))
    count = functools.partial(codec._count, add_special_tokens=True)
    whole = len(codec.encode(text))
    proved = [tokens_of_head(text, limit, count) for limit in (64, 128, 256)]
    assert any(proved), proved  # (a head that proves nothing checks nothing)
    assert all(from_head is None or from_head <= whole for from_head in proved), (proved, whole)


@pytest.mark.parametrize("seed", range(20))
def test_the_head_is_tokenized_as_the_whole_text_begins(codec, seed):
    """The head's own tokens are the whole text's first ones, where it is cut (a word's end): the
    test above compares the head with a text at least twice as long, which no cut could fail."""
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(3_000))
    ids = codec.encode(text)
    for limit in (64, 128, 256):
        if (cut := _word_end(text, limit * HEAD_CHARACTERS_PER_TOKEN)) is not None:
            head = codec.encode(text[:cut])
            assert head == ids[: len(head)], (limit, text[cut - 20 : cut + 5])
