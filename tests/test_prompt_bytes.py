"""A prompt too long by its UTF-8 size alone is refused before tokenizing (byte_level.TokenBytes): the
bound counts the bytes a token stands for, not its vocabulary string's UTF-8 ("Ġ", a space, is 2 bytes
there), and the added tokens' longer texts only where the text holds one."""

from __future__ import annotations

import dataclasses
import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from dayzero.demo import DEMO_CONFIG, build_tokenizer
from dayzero.tokenizer import PromptTooLongError, TextCodec

LIMIT = 1000


@pytest.fixture(scope="module")
def codec():
    return TextCodec(build_tokenizer(DEMO_CONFIG["vocab_size"]))  # the demo checkpoint's


def test_a_prompt_without_spaces_past_the_byte_bound_is_refused_untokenized(codec, monkeypatch):
    """12,000 bytes of "x" (no space: no head to cut) against a context of 1,000: the demo's longest
    model token stands for 12 bytes (" punctuation"), so it has at least 1,000 tokens. The bound was
    29 bytes a token (its vocabulary's longest string, the added <｜begin▁of▁sentence｜>), proving 414:
    the whole text was tokenized to be refused (the gateway's 1 MiB "x" prompt: 1.3 s)."""
    tokenized, tokenizer = [], codec._tok

    class Seen:  # the texts the tokenizer is given
        def encode_batch_fast(self, texts, **kw):
            tokenized.extend(texts)
            return tokenizer.encode_batch_fast(texts, **kw)

    monkeypatch.setattr(codec, "_tok", Seen())
    with pytest.raises(PromptTooLongError) as refused:
        codec.encode("x" * (12 * LIMIT), LIMIT)
    assert (refused.value.tokens, refused.value.limit) == (LIMIT, LIMIT) and not tokenized
    assert len(codec.encode("x" * (12 * LIMIT))) >= LIMIT  # (the bound holds: each "x" is a token)


def test_a_prompt_full_of_angle_brackets_past_the_byte_bound_is_refused_untokenized(codec, monkeypatch):
    """HTML: a "<" in every 4 bytes, none of them an added token's text. The bound let each "<" begin
    an added token of 29 bytes (all of DeepSeek's but one begin with "<"), proving 414 tokens of
    12,000 bytes, and the whole text was tokenized to be refused; only the added tokens the text
    holds count now: none, so 12 bytes a token, 1,000."""
    tokenized, tokenizer = [], codec._tok

    class Seen:
        def encode_batch_fast(self, texts, **kw):
            tokenized.extend(texts)
            return tokenizer.encode_batch_fast(texts, **kw)

    monkeypatch.setattr(codec, "_tok", Seen())
    text = "<b>x</b>" * (12 * LIMIT // 8)
    with pytest.raises(PromptTooLongError) as refused:
        codec.encode(text, LIMIT)
    assert (refused.value.tokens, refused.value.limit) == (LIMIT, LIMIT) and not tokenized
    assert len(codec.encode(text)) >= LIMIT


PIECES = [
    "x" * 40,
    " ",
    "\n\n",
    "123456",
    "中文字符",
    "🙂",
    "<",
    "｜",
    "<｜User｜>",
    "<｜begin▁of▁sentence｜>",
    "｜DSML｜",
    "</think>",
    "<div>",
    " punctuation",
]


@pytest.mark.parametrize("seed", range(20))
def test_the_bound_never_passes_the_tokens_a_text_has(codec, seed):
    """Random texts of long runs, spaces, digits, CJK, emoji, lone "<" and "｜", HTML, added tokens and
    the longest model token, counted by the tokenizer itself; the rough bound under the finer one."""
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 400)))
    for special in (True, False):
        tokens = len(codec.encode(text, special=special))
        rough = codec.token_bytes.least_tokens(text, len(text.encode()), enough=0)  # (its first stage alone)
        assert rough <= codec.token_bytes.least_tokens(text, len(text.encode())) <= tokens


@pytest.mark.parametrize("seed", range(10))
def test_the_added_tokens_found_are_those_the_tokenizer_finds(codec, seed):
    """The bound's added tokens (its own finder) against the tokenizer's: the same texts, in order."""
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 400)))
    added = codec._tok.get_added_tokens_decoder()
    own = [added[i].content for i in codec.encode(text, special=False) if i in added]
    finder = codec.token_bytes.added_finder
    found = [t.content for i in finder.encode(text).ids if (t := finder.get_added_tokens_decoder().get(i))]
    assert found == own


def test_a_prompt_its_added_tokens_cannot_prove_long_is_not_searched_for_them(codec, monkeypatch):
    """1,120 bytes of "hello <b> world " against 1,000: its 70 "<", each at most an added token of 7
    bytes (the demo's fewest, "<think>"), prove 123 tokens at most, yet the text was searched for its
    added tokens before it was tokenized whole (a 300 KB chat of short turns on bench/prompt_bound's
    tokenizer: 31 ms before its 212 ms tokenizing, proving 21,216 against 131,072)."""
    searched, finder = [], codec.token_bytes.added_finder

    class Finder:
        def encode_batch_fast(self, texts, **kw):
            searched.extend(texts)
            return finder.encode_batch_fast(texts, **kw)

    text = "hello <b> world " * 70
    monkeypatch.setattr(codec, "token_bytes", dataclasses.replace(codec.token_bytes, added_finder=Finder()))
    assert len(codec.encode(text, LIMIT)) < LIMIT and not searched
    with pytest.raises(PromptTooLongError):  # (where they can prove it, they are searched for)
        codec.encode("<b>x</b>" * (12 * LIMIT // 8), LIMIT)
    assert searched


@pytest.mark.parametrize("seed", range(10))
def test_a_prompt_is_refused_by_the_bound_as_by_all_its_added_tokens(codec, seed):
    """Skipping the search where it cannot prove ``enough`` refuses what the search refuses, no more:
    random texts as above, and ones dense in the shortest added tokens (more tokens than 12 bytes each)."""
    rng, bound = random.Random(seed), codec.token_bytes
    for pieces in (PIECES, ["<think>", "</think>", "<", "x" * 11]):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 400)))
        size = len(text.encode())
        fine = bound.least_tokens(text, size)
        for enough in {0, 1, fine - 1, fine, fine + 1, rng.randrange(1, size + 2), size + 1}:
            assert (bound.least_tokens(text, size, enough) >= enough) == (fine >= enough), (text, enough)


def test_an_added_token_of_the_finders_own_word_is_not_each_stretch():
    """An added token "\\x00" took the id of the finder's one word (each stretch of text between added
    tokens), so every stretch counted as an added token of 1 byte: 1,000 " punctuation<｜User｜>" (2,001
    tokens with BOS, a 12-byte model token and an added one each) were bounded at 2,917, refused
    against a context of 2,002."""
    tokenizer = build_tokenizer(DEMO_CONFIG["vocab_size"])
    tokenizer.add_tokens(["\x00"])
    codec = TextCodec(tokenizer)
    text = " punctuation<｜User｜>" * 1000
    tokens = len(codec.encode(text))
    assert tokens == 2001 and codec.token_bytes.least_tokens(text, len(text.encode())) <= tokens
    assert len(codec.encode(text, tokens + 1)) == tokens


@pytest.mark.parametrize("model", ["WordLevel", "WordPiece"])
def test_a_word_model_over_byte_level_gets_no_bound(model):
    """A word model emits one [UNK] for a whole word it lacks, however long: 5,000 "x" are 1 token, and
    the bound (5 bytes a token: "[UNK]" taken as a model token's bytes) refused it against 100 as 1,000."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))} | {"[UNK]": 256}
    if model == "WordLevel":
        words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    else:
        words = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    codec = TextCodec(words)
    assert codec.encode("x" * 5000, 100) == [vocab["[UNK]"]]
    assert codec.token_bytes is None
