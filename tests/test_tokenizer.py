"""dayzero.tokenizer: prompt text refused before tokenizing (not Unicode; provably over a limit),
and decoded output without special tokens other than the output protocol's markers."""

from __future__ import annotations

import codecs
import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from dayzero.demo import build_tokenizer, write_demo_checkpoint
from dayzero.stream_decoder import StreamDecoder
from dayzero.tokenizer import InvalidTextError, PromptTooLongError, TextCodec

# the demo vocabulary's longest string: <｜begin▁of▁sentence｜>, "<" 1 + "｜" 3 + "begin" 5 + "▁" 3
# + "of" 2 + "▁" 3 + "sentence" 8 + "｜" 3 + ">" 1 bytes
DEMO_MAX_TOKEN_BYTES = 29
DEMO_PLAIN_TOKEN_BYTES = 12  # its longest model token: "Ġpunctuation", " punctuation" (Ġ: a space's byte)


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    return TextCodec.from_checkpoint(write_demo_checkpoint(tmp_path_factory.mktemp("tok") / "demo"))


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "a \ud800"}],
        [{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": ["ok", "b\ud800c"]}],
    ],
)
def test_a_chat_with_a_lone_surrogate_is_refused_as_invalid_text(codec, messages):
    with pytest.raises(InvalidTextError, match="lone surrogate"):
        codec.chat_ids(messages)


def test_a_prompt_with_a_lone_surrogate_is_refused_as_invalid_text(codec):
    with pytest.raises(InvalidTextError, match=r"'\\udfff'"):
        codec.encode("a \udfff")


def test_the_byte_bound_of_a_lossless_byte_level_tokenizer(codec):
    bound = codec.token_bytes
    assert (bound.plain, bound.added, bound.added_starts) == (DEMO_PLAIN_TOKEN_BYTES, DEMO_MAX_TOKEN_BYTES, "<｜")
    assert bound.least_tokens("<｜User｜>" * 20, 20 * 12) == 20  # the added tokens it holds, one each
    for text in ["a" * 1000, "hello world " * 50, "中文字符" * 40, "🙂" * 30, "<｜User｜>" * 20, ""]:
        assert len(codec.encode(text)) >= -(-len(text.encode()) // DEMO_MAX_TOKEN_BYTES)  # it is a lower bound


def test_tokenizers_that_may_drop_or_merge_text_get_no_byte_bound():
    normalized = build_tokenizer(300)
    normalized.normalizer = normalizers.NFKC()  # "ﬁ" (3 bytes) becomes "fi" (2)
    words = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()  # spaces dropped, a long unknown word one token
    assert TextCodec(normalized).token_bytes is None
    assert TextCodec(words).token_bytes is None


def test_a_prompt_whose_size_proves_it_too_long_is_refused_untokenized(codec):
    limit = 100
    with pytest.raises(PromptTooLongError) as refused:
        codec.encode("x" * (DEMO_PLAIN_TOKEN_BYTES * limit), limit)  # at least 100 tokens
    assert (refused.value.tokens, refused.value.limit) == (100, 100)
    assert len(codec.encode("x" * (DEMO_PLAIN_TOKEN_BYTES * (limit - 1)), limit)) >= limit - 1  # bound 99: counted


def test_a_chat_of_nine_800_kb_messages_is_refused_from_its_size(codec):
    text = "hello world, numbers 1 2 3 and punctuation; " * 18182  # 800008 bytes
    with pytest.raises(PromptTooLongError) as refused:
        codec.chat_ids([{"role": "user", "content": text}] * 9, limit=4096)
    # BOS 29 + <｜User｜> 12 + 9 x 800008 + 8 "\n\n" 16 + <｜Assistant｜> 17 + </think> 8 = 7200154 bytes
    # of which at most 10 added tokens (where its 4 "<" and 6 "｜" are) of at most 29 bytes, the rest 12 a token
    assert refused.value.tokens == 10 + -(-(7200154 - 10 * DEMO_MAX_TOKEN_BYTES) // DEMO_PLAIN_TOKEN_BYTES) == 599999


def test_decoded_output_leaves_out_special_tokens(codec):
    """As a completion of "" (BOS) or of a chat ending with an assistant turn may read."""
    assert codec.decode(codec.encode("<｜User｜>The")) == "The"
    assert (
        codec.decode(codec.encode("<｜Assistant｜>a<｜latest_reminder｜><｜deepseek_image｜>b<｜end▁of▁sentence｜>"))
        == "ab"
    )


def test_a_token_is_shown_where_decoded_text_holds_it(codec):
    """``shown`` as ``decode`` writes each id: special tokens and ids past the tokenizer (a model's
    vocabulary padded past it) nothing; every other id its text, the first of a piece that a Unigram
    vocabulary lists twice too (camembert's does: ``get_vocab``, a piece -> id map, keeps the last)."""
    repeating = TextCodec(Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0), ("a", -3.0)], 0, False)))
    for each in (codec, repeating):
        ids = range(each.vocab_size + 8)
        assert [each.shown(t) for t in ids] == [bool(each.decode([t])) for t in ids]


def test_a_tokens_piece_is_its_own_text_and_the_bytes_it_stands_for(codec):
    """Every token of the vocabulary against transformers' byte-level table, the special ones
    named by their text; a character split over tokens shows U+FFFD per part while the parts'
    bytes join into its UTF-8."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    vocab = {i: t for t, i in codec._tok.get_vocab(with_added_tokens=True).items()}
    special = {i for i, t in codec._tok.get_added_tokens_decoder().items() if t.special}
    for token, string in vocab.items():
        text, raw = codec.token_piece(token)
        assert raw == (string.encode() if token in special else bytes(byte_of[c] for c in string)), token
        assert text == raw.decode(errors="replace"), token
    ids = codec.encode("中文 <｜end▁of▁sentence｜>", None)[1:]
    pieces = [codec.token_piece(t) for t in ids]
    assert [text for text, _ in pieces][-1] == "<｜end▁of▁sentence｜>" and codec.decode(ids[-1:]) == ""
    assert "\ufffd" in pieces[0][0] and b"".join(raw for _, raw in pieces) == "中文 <｜end▁of▁sentence｜>".encode()


def test_decoded_output_keeps_the_markers_the_answer_parser_reads(codec):
    text = '<think>plan</think>ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">'
    assert codec.decode(codec.encode(text)) == text
    assert codec.decode_all(codec.encode("<｜User｜>x")) == "<｜begin▁of▁sentence｜><｜User｜>x"  # prompts: all kept


def _utf8_released(codec, ids: list[int]) -> str:
    """What a stream of ``ids`` may have released by now: the text of their bytes but for the one
    U+FFFD of a character cut short, a tail Python's incremental UTF-8 decoder holds back (it holds
    a surrogate's first two bytes, ED A0..BF, too: their first U+FFFD is for good). A byte that
    begins no character is U+FFFD for good."""
    utf8 = b"".join(codec.token_piece(t)[1] for t in ids if codec.decode([t]))
    held = codecs.getincrementaldecoder("utf-8")("replace")
    held.decode(utf8)
    text = utf8.decode(errors="replace")
    return text[:-1] if held.getstate()[0] else text


def _byte_token(codec, byte: int) -> int:
    """The token of the byte-level vocabulary that stands for ``byte`` alone."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return codec.token_id(bytes_to_unicode()[byte])


def test_stream_decoding_releases_all_but_a_cut_character(codec):
    """The incremental decoder against Python's UTF-8 decoder, at every token. Random ids cut
    characters, write stray continuation bytes and runs of lead bytes, and hide special tokens."""
    rng = random.Random(0)
    text = "dayzero: héllo — 4 bits, 深度求索 🚀🚀 <think>plan</think> done"
    streams = [codec.encode(text)[1:]] + [[rng.randrange(codec.vocab_size) for _ in range(300)] for _ in range(5)]
    edges = [_byte_token(codec, b) for b in (0x41, 0x80, 0xA0, 0xBF, 0xC0, 0xC2, 0xE0, 0xE4, 0xED, 0xF0, 0xF4, 0xF5)]
    streams += [[rng.choice(edges) for _ in range(300)]]  # lead bytes' runs, surrogates, bytes UTF-8 never has
    for ids in streams:
        stream, released = StreamDecoder(codec), ""
        for i, token in enumerate(ids):
            released += stream.push(token)
            assert released == _utf8_released(codec, ids[: i + 1]), i
    whole = StreamDecoder(codec)
    assert "".join(whole.push(t) for t in codec.encode(text)[1:]) == text


def test_stray_bytes_stream_at_once_and_a_cut_character_waits(codec):
    """A byte that begins no character (0xB2) is U+FFFD whatever follows: released with its token.
    Every text ending in U+FFFD was held for the next token, so a run of them released nothing at
    all: 1,000 such tokens streamed no text, their reply's content was "" (and each step decoded
    the whole run again)."""
    stray, lead, mid, last = (_byte_token(codec, b) for b in (0xB2, 0xE4, 0xB8, 0xAD))
    stream = StreamDecoder(codec)
    assert [stream.push(stray) for _ in range(3)] == [b"\xb2".decode(errors="replace")] * 3
    assert [stream.push(t) for t in (lead, mid, last)] == ["", "", b"\xe4\xb8\xad".decode()]  # 中
    assert [stream.push(t) for t in (lead, codec.token_id("A"))] == ["", b"\xe4A".decode(errors="replace")]


def test_a_run_of_lead_bytes_streams_all_but_its_last(codec, monkeypatch):
    """Each lead byte (0xE4) ends the one before as U+FFFD for good, and only the last may still
    complete: it alone waits. The whole run was held (1,000 such tokens streamed no text, their
    reply's content was ""), and each step read the bytes of every token held again."""
    lead, a = _byte_token(codec, 0xE4), codec.token_id("A")
    stream = StreamDecoder(codec)
    assert [stream.push(lead) for _ in range(3)] == ["", "\ufffd", "\ufffd"]
    assert stream.push(a) == "\ufffdA"
    pieces = []
    monkeypatch.setattr(codec, "token_piece", lambda t, piece=codec.token_piece: pieces.append(t) or piece(t))
    stream = StreamDecoder(codec)
    assert "".join(stream.push(lead) for _ in range(200)) == "\ufffd" * 199
    assert len(pieces) <= 4 * 200  # the last 4 bytes decide: was 19,900 (every held token's, at each)


def test_a_byte_fallback_character_waits_for_its_last_byte():
    """A tokenizer that is not byte-level (sentencepiece's byte fallback: <0xE4> tokens) renders a
    run of byte tokens whole, one that is not UTF-8 as U+FFFD each (a later byte turns a whole 中
    into three): nothing of a run streams till a token that is no byte ends it, or till its bytes
    can be UTF-8 no more (then it is one U+FFFD a byte, whatever follows: all but a cut character
    streams)."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)} | {"A": 256}
    tokenizer = Tokenizer(models.BPE(vocab, [], byte_fallback=True))
    tokenizer.decoder = decoders.ByteFallback()
    codec = TextCodec(tokenizer)
    assert codec.token_bytes is None
    stream = StreamDecoder(codec)
    assert [stream.push(t) for t in (0xE4, 0xB8, 0xAD, 256)] == ["", "", "", "中A"]
    assert [stream.push(t) for t in (0xE4, 0xE4, 256)] == ["", "\ufffd", "\ufffdA"]


def test_a_damaged_tokenizer_config_is_named(tmp_path):
    ckpt = write_demo_checkpoint(tmp_path / "d")
    (ckpt / "tokenizer_config.json").write_text("{'chat_template': ")
    with pytest.raises(ValueError, match=f"^{ckpt / 'tokenizer_config.json'} is not valid JSON: "):
        TextCodec.from_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[1]", " must hold a JSON object, got list"),
        ('{"eos_token": 3}', ": eos_token must be a string or an object with a string content, got 3"),
        ('{"bos_token": {"id": 0}}', ": bos_token must be a string or an object with a string content, got {'id': 0}"),
    ],
)
def test_a_tokenizer_config_of_the_wrong_shape_is_named(tmp_path, text, error):
    """Each was a Python traceback (AttributeError, TypeError) from ``generate`` and the gateway."""
    ckpt = write_demo_checkpoint(tmp_path / "d")
    (ckpt / "tokenizer_config.json").write_text(text)
    with pytest.raises(ValueError) as refused:
        TextCodec.from_checkpoint(ckpt)
    assert str(refused.value) == f"{ckpt / 'tokenizer_config.json'}{error}"


def test_a_tokenizer_config_that_is_not_utf8_is_named(tmp_path):
    ckpt = write_demo_checkpoint(tmp_path / "d")
    (ckpt / "tokenizer_config.json").write_bytes(b'{"bos_token": "\xff"}')
    with pytest.raises(ValueError, match=f"^{ckpt / 'tokenizer_config.json'} is not valid JSON: "):
        TextCodec.from_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("source", "high", "maximum"), [("REASONING_EFFORT_MAX = (", "", "Absolute"), (None, "Absolute", "Beyond")]
)
def test_the_effort_paragraphs_are_the_checkpoints_own(tmp_path, source, high, maximum):
    """DeepSeek-V4-Flash / -Pro ship an encoder whose "high" adds nothing and "max" the "Absolute
    maximum" paragraph; without an encoder beside the weights, the 0731 revision's table."""
    from dayzero.chat.encoding import ChatOptions

    ckpt = write_demo_checkpoint(tmp_path / "d")
    if source is not None:
        (ckpt / "encoding").mkdir()
        (ckpt / "encoding" / "encoding_dsv4.py").write_text(source)
    codec = TextCodec.from_checkpoint(ckpt)
    user = [{"role": "user", "content": "Hi"}]
    opening = "<｜begin▁of▁sentence｜>Reasoning Effort: "
    for effort, word in (("high", high), ("max", maximum)):
        prompt = codec.chat_prompt(user, ChatOptions(thinking=True, effort=effort))
        assert prompt.startswith(opening + word) if word else prompt.startswith("<｜begin▁of▁sentence｜><｜User｜>")
