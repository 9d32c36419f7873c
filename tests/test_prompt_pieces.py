"""A long prompt is tokenized in pieces cut at digit edges, and refused once they reach the limit; a
prompt under it gets the ids the tokenizer gives the whole text (the demo tokenizer: GPT-2's regex;
one under DeepSeek-V3's pre-tokenizers, trained under them, with V3's added tokens holding digits)."""

from __future__ import annotations

import base64
import functools
import random

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors, trainers

from dayzero import prompt_pieces
from dayzero.chat.tokens import BOS, EOS
from dayzero.demo import DEEPSEEK_V3_SPLITS, DEMO_CONFIG, SPECIAL_TOKENS, build_tokenizer, deepseek_v3_pre_tokenizer
from dayzero.tokenizer import PromptTooLongError, TextCodec

V3_ADDED = [f"<｜place▁holder▁no▁{i}｜>" for i in range(20)]  # (digits inside added tokens)
LIMIT = 4096
ENDING_IN_DIGITS = "page12"
TOKEN_AT_EDGES = "<img2024>"  # an added token edges ("g2", "4>") and runs ("202|4") would cut, unchecked
PIECES = [
    *(
        "31415926535",
        "2718281828459045",
        "ab",
        "Zq",
        "0",
        "12",
        "345",
        "6789",
        "+",
        "/",
        "=",
        ",",
        ":",
        "{",
        "}",
        "[",
        "]",
        '"',
        "'",
        "'s",
        "x1",
        "1x",
    ),
    *(
        ".5",
        "-3",
        " ",
        "  ",
        "\n",
        " 7",
        "中文",
        "²",
        "½",
        "é",
        "<｜User｜>",
        "<｜place▁holder▁no▁17｜>",
        "<｜",
        "｜>",
        TOKEN_AT_EDGES,
        "img2024",
        "2024>",
        ENDING_IN_DIGITS,
    ),
]


@functools.cache
def v3_like(*added: str) -> Tokenizer:
    """Byte-level BPE under V3's pre-tokenizers, trained on random text of ``PIECES`` (merges of
    digits in threes, of " 7", of "'s"...): a cut where V3 does not split changes its tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = deepseek_v3_pre_tokenizer()
    rng = random.Random(0)
    texts = ["".join(rng.choice(PIECES) for _ in range(200)) for _ in range(50)]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=1000, initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens([*SPECIAL_TOKENS, *V3_ADDED, TOKEN_AT_EDGES, *added])
    return tokenizer


@pytest.fixture(scope="module", params=["demo", "demo, EOS after", "v3", "v3, an added token ending in digits"])
def codec(request):
    if request.param.startswith("v3"):  # (a digit run after one begins where it ends: none is cut)
        return TextCodec(v3_like(*[ENDING_IN_DIGITS] * request.param.endswith("digits")))
    tokenizer = build_tokenizer(DEMO_CONFIG["vocab_size"])
    tokenizer.add_special_tokens([TOKEN_AT_EDGES])
    if request.param == "demo, EOS after":  # (a template with special tokens on both sides)
        specials = [(BOS, tokenizer.token_to_id(BOS)), (EOS, tokenizer.token_to_id(EOS))]
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}", special_tokens=specials)
    return TextCodec(tokenizer)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("piece", [3, 16])
def test_pieces_tokenize_as_the_whole_text(codec, piece, seed, monkeypatch):
    """Pieces of at least 3 characters, so a text is cut at nearly each of its digit edges, or 16 (a
    piece's end searched for past an added token's digits): random texts of base64-like runs, digit
    runs, JSON punctuation, spaces before digits, "'s", CJK, "²" (a digit to the tokenizer's \\p{N},
    not to ASCII) and added tokens with digits in them, against the ids the tokenizer gives the whole
    text."""
    monkeypatch.setattr(prompt_pieces, "PIECE_CHARACTERS", piece)
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 300)))
    for special in (True, False):
        assert codec.encode(text, 1 << 30, special) == codec._tok.encode(text, add_special_tokens=special).ids


@pytest.mark.parametrize("kind", ["base64", "minified JSON"])
def test_space_free_text_past_the_limit_is_refused_from_its_first_pieces(codec, kind, monkeypatch):
    """Under the byte bound (a model token of 12 bytes: 12 a token of the limit) and with no space for
    a head: base64 of 8 characters a token of the limit was tokenized whole to be refused (786,420
    characters against 65,536 on the demo: 0.5 s); now pieces until they pass the limit: less than
    half of it (a token of the limit takes at most 2 characters, and a piece 1,024 here)."""
    rng = random.Random(1)
    if kind == "base64":
        text = base64.b64encode(rng.randbytes(LIMIT * 6)).decode()  # (8 characters a token of the limit)
    else:
        text = ",".join(f'{{"id":{rng.randrange(10**6)},"k":"v{rng.randrange(99)}"}}' for _ in range(LIMIT // 3))
    _refused_after_reading_less_than_half(codec, text, monkeypatch)


def test_a_digit_string_past_the_limit_is_refused_from_its_first_pieces_under_v3(monkeypatch):
    """A run of digits is one pre-token under GPT-2's regex, but V3 splits it in threes from its
    start: 24,576 digits (16,385 tokens) were tokenized whole to be refused; now pieces of it, cut a
    multiple of 3 digits into it."""
    text = "x" + "".join(random.Random(2).choice("0123456789") for _ in range(LIMIT * 6))
    _refused_after_reading_less_than_half(TextCodec(v3_like()), text, monkeypatch)


def _refused_after_reading_less_than_half(codec: TextCodec, text: str, monkeypatch) -> None:
    monkeypatch.setattr(prompt_pieces, "PIECE_CHARACTERS", 1024)
    given, tokenizer = [], codec._tok

    class Seen:  # the texts the tokenizer is given
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode_batch_fast(self, texts, **kw):
            given.extend(texts)
            return tokenizer.encode_batch_fast(texts, **kw)

    monkeypatch.setattr(codec, "_tok", Seen())
    with pytest.raises(PromptTooLongError) as refused:
        codec.encode(text, LIMIT)
    monkeypatch.undo()
    assert given and sum(map(len, given)) < len(text) // 2, (sum(map(len, given)), len(text))
    assert LIMIT <= refused.value.tokens <= len(codec.encode(text)), refused.value.tokens


@pytest.mark.parametrize(
    "pre",
    [
        pre_tokenizers.ByteLevel(add_prefix_space=True),  # (each piece would begin with a space)
        pre_tokenizers.Metaspace(),
        pre_tokenizers.Sequence([pre_tokenizers.Digits(), pre_tokenizers.ByteLevel()]),  # (not V3's Split)
        pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(DEEPSEEK_V3_SPLITS[2]), "isolated"), pre_tokenizers.ByteLevel()]
        ),
    ],
)
def test_other_pre_tokenizers_are_tokenized_whole(pre):
    """Where a digit edge is not known to split as the whole text does, no piece is cut."""
    tokenizer = build_tokenizer(DEMO_CONFIG["vocab_size"])
    tokenizer.pre_tokenizer = pre
    assert TextCodec(tokenizer).piece_cuts is None


def test_an_added_token_that_stands_alone_as_a_word_leaves_the_text_whole():
    """A ``single_word`` added token is matched by what stands beside it: cut before it, a piece
    begins with it (no word character before) where the whole text had one."""
    from tokenizers import AddedToken

    tokenizer = build_tokenizer(DEMO_CONFIG["vocab_size"])
    tokenizer.add_tokens([AddedToken("7x", single_word=True)])
    assert TextCodec(tokenizer).piece_cuts is None


@pytest.mark.parametrize("template", [f"{BOS} $A $A", BOS])
def test_a_template_holding_the_text_other_than_once_leaves_it_whole(template):
    """The template's special tokens are joined around the pieces' ids: with the text twice in it (or
    not at all) there is no such before and after. The codec failed to load (TypeError, ValueError),
    where it had encoded such a tokenizer's prompts as the tokenizer does."""
    tokenizer = build_tokenizer(DEMO_CONFIG["vocab_size"])
    tokenizer.post_processor = processors.TemplateProcessing(single=template, special_tokens=[(BOS, 0)])
    codec, text = TextCodec(tokenizer), "x1" * prompt_pieces.PIECE_CHARACTERS
    assert codec.piece_cuts is None and codec.encode(text, 1 << 30) == tokenizer.encode(text).ids
