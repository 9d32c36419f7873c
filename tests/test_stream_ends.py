"""A completion's text at its ends: every end (EOS, max_tokens, the time limit, a request that
waited past it) releases what its tokens held back and matches the stop strings in it, as vLLM
matches them on the detokenized text, its final flush included; a byte-fallback tokenizer's
stream is transformers' decode of the same ids."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from dayzero.completion import Completion
from dayzero.completion_text import CompletionText, StopMatcher
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.time_limit import past_limit
from dayzero.stream_decoder import StreamDecoder
from dayzero.tokenizer import TextCodec

from .test_engine import _until_finished
from .test_lead_space import llama_style
from .test_tokenizer import _byte_token

EOS = (1,)


def _streamed(codec, sampling: SamplingParams, ids: list[int]) -> tuple[str, str | None]:
    """The text a completion streams for ``ids`` (the last of them ends it, or none does) and its
    finish reason."""
    return _until_finished(Completion(codec, sampling, EOS, 2, 4096), ids)


def test_a_stop_string_the_cut_characters_u_fffd_completes_ends_every_end_alike(codec):
    """ "Hi" then 中's lead byte (0xE4, a character cut short: U+FFFD at the end) with stop
    "i\\ufffd": the text "Hi\\ufffd" holds it, so the answer is "H", finish "stop", by a token limit
    and by the time limit on a request that waited (it had streamed "H" and held the rest; its
    ending carried "i\\ufffd" past the stop string, finish "length")."""
    ids = codec.encode("Hi", special=False) + [_byte_token(codec, 0xE4)]
    assert codec.decode(ids) == "Hi\ufffd"
    sampling = SamplingParams(max_tokens=len(ids), stop=("i\ufffd",))
    assert _streamed(codec, sampling, ids) == ("H", "stop")  # max_tokens ends it on the byte
    waited = SamplingParams(max_tokens=9, stop=("i\ufffd",))
    streamed, finish = _streamed(codec, waited, ids)
    assert (streamed, finish) == ("H", None)
    request = GenerationRequest(request_id="w", prompt_ids=(0, 5), sampling=waited, created=0.0)
    end = past_limit(codec, request, ids, 1.0)
    assert (streamed + end.text, end.reason) == ("H", "stop")


def test_a_request_that_waited_ends_with_the_stop_strings_held_text(codec):
    """ "Hi" with stop "ix": "i" is held as the stop string's start; a request that waited past the
    time limit ends with it, as a token limit does ("Hi", finish "length")."""
    ids = codec.encode("Hi", special=False)
    sampling = SamplingParams(max_tokens=9, stop=("ix",))
    streamed, _ = _streamed(codec, sampling, ids)
    request = GenerationRequest(request_id="w", prompt_ids=(0, 5), sampling=sampling, created=0.0)
    end = past_limit(codec, request, ids, 1.0)
    assert (streamed + end.text, end.reason) == ("Hi", "length")
    assert _streamed(codec, SamplingParams(max_tokens=len(ids), stop=("ix",)), ids) == ("Hi", "length")


@pytest.fixture(scope="module")
def fallback() -> Tokenizer:
    """A Llama-style byte-fallback tokenizer: sentencepiece's ``<0x00>``..``<0xFF>`` byte tokens, ``▁``
    for spaces, and the decoder transformers' Llama and Mistral tokenizer.json files carry."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "a", "▁Hi", "中", "é", "!"]
    model = models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True, unk_token="<unk>")
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _stream(codec: TextCodec, ids: list[int]) -> tuple[str, str]:
    """The text streamed for ``ids``, and what the end's flush adds."""
    decoder = StreamDecoder(codec)
    streamed = "".join(decoder.push(token) for token in ids)
    return streamed, decoder.flush()


def test_a_byte_fallback_stream_is_transformers_decode_at_every_token(fallback):
    """A run of byte tokens decodes whole (transformers' decode: its UTF-8, or one U+FFFD per byte
    where it is not valid UTF-8): "中" then a lead byte is four U+FFFD, not "中" and one. The stream
    released "中" as its run completed; now it holds a run till a token that is no byte ends it."""
    codec, transformers = TextCodec(fallback), PreTrainedTokenizerFast(tokenizer_object=fallback)
    byte = [fallback.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    zh = [byte[b] for b in "中".encode()]
    hi, a = fallback.token_to_id("▁Hi"), fallback.token_to_id("a")
    assert transformers.decode([hi, *zh, byte[0xE4]]) == "Hi\ufffd\ufffd\ufffd\ufffd"
    assert _stream(codec, [hi, *zh, byte[0xE4]]) == ("Hi", "\ufffd\ufffd\ufffd\ufffd")
    assert _stream(codec, [*zh, *zh, a]) == ("中中a", "")
    rng = random.Random(0)
    choices = [*byte, *zh * 8, hi, a, *(fallback.token_to_id(p) for p in ("▁", "中", "é", "!"))]
    for _ in range(300):
        ids = [rng.choice(choices) for _ in range(rng.randint(1, 8))]
        streamed, flushed = _stream(codec, ids)
        assert streamed + flushed == transformers.decode(ids), ids
        assert transformers.decode(ids).startswith(streamed), ids  # nothing streamed that a later token changes


def test_a_byte_fallback_tokens_logprob_bytes_are_its_byte(fallback):
    """``<0xE4>`` stands for the byte 0xE4 (its bytes were its name's: b"<0xE4>")."""
    codec = TextCodec(fallback)
    assert codec.token_piece(fallback.token_to_id("<0xE4>")) == ("\ufffd", b"\xe4")
    assert codec.token_piece(fallback.token_to_id("<0x41>")) == ("A", b"A")
    # its decoder strips one leading space of a text: <0x20> alone decodes to "", its byte is b" "
    assert codec.token_piece(fallback.token_to_id("<0x20>")) == (" ", b" ")


def test_a_stop_string_a_run_of_byte_tokens_completes_ends_on_its_last_byte(fallback):
    """Stop "中", written as its three byte tokens after "Hi" and "文" (three more): the text of
    the ids first holds it at the seventh token (transformers' decode of each prefix), so the
    completion ends there, 7 tokens counted, as a byte-level tokenizer's ends on the token that
    completes a stop string. The held run ended it one token late (8 counted, the text the same),
    and missed it in a run a later byte turns to U+FFFD each (中, then 0xE4: it ends on 中's last)."""
    codec, transformers = TextCodec(fallback), PreTrainedTokenizerFast(tokenizer_object=fallback)
    byte = [fallback.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    hi, a = fallback.token_to_id("▁Hi"), fallback.token_to_id("a")
    wen, zh = [byte[b] for b in "文".encode()], [byte[b] for b in "中".encode()]
    for ids, text, tokens in (([hi, *wen, *zh, a], "Hi文", 7), ([*zh, byte[0xE4], a], "", 3)):
        assert next(k for k in range(len(ids) + 1) if "中" in transformers.decode(ids[:k])) == tokens
        completion = Completion(codec, SamplingParams(max_tokens=50, stop=("中",)), EOS, 2, 4096)
        assert _until_finished(completion, ids) == (text, "stop")
        assert completion.usage()["completion_tokens"] == tokens


def test_a_stop_string_inside_a_long_run_of_byte_tokens_ends_on_its_last_byte(fallback, codec):
    """Stop "中" after "Hi" and 文 40 times, all in byte tokens (one run of 126): transformers' decode
    of the ids first holds "中" at token 124, and the completion ends there, as one of DeepSeek's
    byte-level tokenizer (the demo's) ends on the token whose text first holds it. The probe read a
    held run of 64 tokens at most (``ENDING_TOKENS``): the stop string ended it as the run did, at
    the "a" after it (128 tokens counted, the text the same)."""
    reference, byte = PreTrainedTokenizerFast(tokenizer_object=fallback), _bytes(fallback)
    written = "文" * 40 + "中文"
    runs = [fallback.token_to_id("▁Hi"), *(byte[b] for b in written.encode()), fallback.token_to_id("a")]
    byte_level = codec.encode("Hi" + written + "a", special=False)
    ends = []
    for text_codec, ids, decode in ((TextCodec(fallback), runs, reference.decode), (codec, byte_level, codec.decode)):
        completion = Completion(text_codec, SamplingParams(max_tokens=500, stop=("中",)), EOS, 2, 4096)
        assert _until_finished(completion, ids) == ("Hi" + "文" * 40, "stop")
        ends.append(
            (completion.usage()["completion_tokens"], next(k for k in range(len(ids)) if "中" in decode(ids[:k])))
        )
    assert ends[0] == (124, 124) and ends[1][0] == ends[1][1] < len(byte_level)


@pytest.mark.parametrize(("stop", "text"), [("文", "中 "), (" 文", "中")])
def test_a_space_after_a_left_out_token_in_a_run_of_byte_tokens_reaches_the_stop_strings(stop, text):
    """中, <s> (left out), " 文" in byte tokens, "d": the stop ends "中 文d" (transformers' decode) on 文's
    last byte, token 8. The probe decoded on from <s>, dropping the space after it: "中", " 文" late."""
    tokenizer = llama_style()
    byte, s = _bytes(tokenizer), tokenizer.token_to_id("<s>")
    ids = [*(byte[b] for b in "中".encode()), s, *(byte[b] for b in " 文".encode()), tokenizer.token_to_id("d")]
    assert PreTrainedTokenizerFast(tokenizer_object=tokenizer).decode(ids, skip_special_tokens=True) == "中 文d"
    completion = Completion(TextCodec(tokenizer), SamplingParams(max_tokens=50, stop=(stop,)), (2,), 2, 4096)
    assert _until_finished(completion, ids) == (text, "stop")
    assert completion.usage()["completion_tokens"] == 8


def _bytes(fallback: Tokenizer) -> list[int]:
    """The byte-fallback tokenizer's byte tokens, by byte."""
    return [fallback.token_to_id(f"<0x{b:02X}>") for b in range(256)]


def test_a_run_of_byte_tokens_that_is_not_utf8_streams_at_once(fallback):
    """500 byte tokens 0x80 (a byte no UTF-8 character begins with): transformers' decode is one
    U+FFFD a byte whatever follows, so each streams with its token. The run was held whole till
    a token that is no byte (or the end) came: 500 tokens streamed no text."""
    codec, transformers = TextCodec(fallback), PreTrainedTokenizerFast(tokenizer_object=fallback)
    ids = [fallback.token_to_id("<0x80>")] * 500
    assert transformers.decode(ids) == "\ufffd" * 500
    decoder = StreamDecoder(codec)
    assert [decoder.push(token) for token in ids] == ["\ufffd"] * 500
    assert decoder.flush() == ""


def _pushed(codec, sampling: SamplingParams, thinking: bool, ids: list[int]) -> tuple[str, str, int]:
    """What pushing ``ids`` one by one streams, what its end then releases, and its reasoning tokens."""
    text = CompletionText(codec, sampling, thinking)
    streamed = "".join(text.push(token)[0] for token in ids)
    return streamed, text.end()[0], text.reasoning.tokens


def test_a_long_replay_decodes_its_stream_in_chunks_and_ends_as_its_pushes(codec, monkeypatch):
    """A 3,000-token thinking-mode stream (a 1,200-token thought, ``</think>``, an answer ending in
    a stop string's start and 中's lead byte): the time limit's replay ends it as its pushes one by
    one do (the held "i" of stop "ix" and U+FFFD; 1,201 reasoning tokens: the thought and
    ``</think>``), the stream and the ending together transformers-exact (the demo tokenizer's
    decode with the thought's marker kept). It decoded the stream token by token (6,000 decodes, 16
    us a token in the reaper's thread): now in chunks of 256, about a hundred."""
    words = codec.encode("The quick brown fox jumps over the lazy dog. ", special=False)
    thought = (words * 200)[:1200]
    answer = (words * 200)[: 3000 - 1203] + codec.encode(" Hi", special=False)[-1:] + [_byte_token(codec, 0xE4)]
    ids = [*thought, codec.token_id("</think>"), *answer]
    sampling = SamplingParams(max_tokens=5000, stop=("ix",))
    streamed, ending, reasoning = _pushed(codec, sampling, True, ids)
    assert (ending, reasoning) == ("i\ufffd", 1201) and streamed + ending == codec.decode(ids)
    calls = []
    monkeypatch.setattr(codec, "decode", lambda ids, decode=codec.decode: calls.append(ids) or decode(ids))
    request = GenerationRequest(request_id="w", prompt_ids=(0, 5), sampling=sampling, created=0.0, thinking=True)
    end = past_limit(codec, request, ids, 1.0)
    assert (end.text, end.reason, end.usage["completion_tokens_details"]["reasoning_tokens"]) == (
        ending,
        "length",
        1201,
    )
    assert len(calls) < 200


def test_a_byte_fallback_replay_ends_as_its_pushes_whatever_its_chunks_cut(fallback):
    """Random byte-fallback streams of 600 tokens, runs of byte tokens crossing the replay's chunks:
    the replay's ending is that of the pushes one by one, and with what they streamed, transformers'
    decode of the ids."""
    codec, transformers = TextCodec(fallback), PreTrainedTokenizerFast(tokenizer_object=fallback)
    byte = [fallback.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    zh = [byte[b] for b in "中".encode()]
    choices = [*byte[0x80:0xF5], *zh * 40, *(fallback.token_to_id(p) for p in ("▁", "a", "中", "é", "!"))]
    rng, sampling = random.Random(0), SamplingParams(max_tokens=5000, stop=("!a!",))
    for _ in range(20):
        ids = [rng.choice(choices) for _ in range(600)]
        streamed, ending, _ = _pushed(codec, sampling, False, ids)
        assert streamed + ending == transformers.decode(ids).split("!a!")[0]
        assert CompletionText.replayed(codec, sampling, False, ids).end()[0] == ending


def test_a_long_run_of_byte_tokens_is_not_decoded_again_at_every_byte(fallback, monkeypatch):
    """中 500 times as 1,500 byte tokens, stop "中x": the stop-string probe decodes a held run from
    its character before last at each byte (``StreamDecoder.ending``); it decoded all of it at
    every byte (about 1.1 million ids in all, seconds), and the run still streams whole,
    transformers-exact, at its end. The stop strings read each character once as the probe's and
    once at the end: the probe fed them all of the run's text at every byte (125,750 characters)."""
    codec, decoded, fed, feed = TextCodec(fallback), [], [], StopMatcher.feed
    ids = [fallback.token_to_id(f"<0x{b:02X}>") for b in ("中" * 500).encode()]
    monkeypatch.setattr(codec, "decode", lambda ids, decode=codec.decode: decoded.append(len(ids)) or decode(ids))
    monkeypatch.setattr(StopMatcher, "feed", lambda self, text: fed.append(text) or feed(self, text))
    text = CompletionText(codec, SamplingParams(max_tokens=5000, stop=("中x",)), False)
    assert [text.push(token) for token in ids] == [("", False)] * len(ids)
    assert text.end() == ("中" * 500, False)
    assert sum(decoded) < 20 * len(ids) and sum(map(len, fed)) == 2 * 500


def test_an_ids_only_replay_takes_its_tokens_in_chunks(monkeypatch):
    """A checkpoint without a tokenizer (``IdsOnlyCodec``: no text): its stream's replay, thinking
    mode, 3,000 tokens, counts 3,000 reasoning tokens (the thought never ends) and decodes in chunks.
    No token released text, so each push sliced and decoded every id since the first (100,000
    tokens: 28 s); now about 2 decodes a chunk of 256."""
    codec, calls = IdsOnlyCodec(), []
    monkeypatch.setattr(codec, "decode", lambda ids: calls.append(len(ids)) or "")
    text = CompletionText.replayed(codec, SamplingParams(max_tokens=5000, stop=("x",)), True, list(range(3000)))
    assert (text.end(), text.reasoning.tokens) == (("", False), 3000)
    assert len(calls) < 100


def test_a_byte_level_cut_character_costs_no_stop_string_probe(codec, monkeypatch):
    """DeepSeek's byte-level path: Chinese text the demo tokenizer writes in byte tokens (each character
    cut short for two of its three tokens), stop "xyz": the stop-string probe (``StreamDecoder.ending``)
    decodes nothing, as only a byte-fallback run's held text can complete a stop string; it decoded
    the held cut character again at each such token (3,202 decodes for 960 tokens, 1,922 without)."""
    ids = codec.encode("深度求索的模型在中文上表现很好。" * 20, special=False)
    whole, calls = codec.decode(ids), []
    monkeypatch.setattr(codec, "decode", lambda ids, decode=codec.decode: calls.append(len(ids)) or decode(ids))
    decodes = []
    for stop in ((), ("xyz",)):
        text = CompletionText(codec, SamplingParams(max_tokens=5000, stop=stop), False)
        assert "".join(text.push(token)[0] for token in ids) + text.end()[0] == whole
        decodes.append(len(calls) - sum(decodes))
    assert decodes[1] == decodes[0]


def test_a_replay_inside_a_long_run_of_byte_tokens_takes_its_tokens_in_chunks(fallback, monkeypatch):
    """中 1,000 times as 3,000 byte tokens (one run, held till it ends), thinking mode: the replay
    ends as the pushes one by one do (the run's text; 3,000 reasoning tokens) with a few run checks
    a chunk. A chunk inside the open run was not settled, so each was split down to single pushes
    (5,988 ``open_run`` calls: slower than the pushes one by one, 1.1 s against 0.6 s for 9,000)."""
    codec = TextCodec(fallback)
    ids = [fallback.token_to_id(f"<0x{b:02X}>") for b in ("中" * 1000).encode()]
    sampling = SamplingParams(max_tokens=5000, stop=("x",))
    assert _pushed(codec, sampling, True, ids) == ("", "中" * 1000, 3000)
    calls = []
    monkeypatch.setattr(codec, "open_run", lambda ids, known=0, run=codec.open_run: calls.append(1) or run(ids, known))
    text = CompletionText.replayed(codec, sampling, True, ids)
    assert (text.end()[0], text.reasoning.tokens) == ("中" * 1000, 3000)
    assert len(calls) < 100


def test_an_ids_only_live_stream_decodes_nothing_per_token(monkeypatch):
    """The live stream of a checkpoint without a tokenizer (``IdsOnlyCodec``: no text), 3,000 tokens
    with a stop string: no token released text, so each push kept every id since the first and
    decoded them all again (4.5 million ids in all here; 100,000 tokens: 168 s); now no
    push decodes any, and the end releases nothing."""
    codec, decoded = IdsOnlyCodec(), []
    monkeypatch.setattr(codec, "decode", lambda ids: decoded.append(len(ids)) or "")
    text = CompletionText(codec, SamplingParams(max_tokens=5000, stop=("x",)), False)
    assert [text.push(token) for token in range(3000)] == [("", False)] * 3000
    assert text.end() == ("", False)
    assert sum(decoded) == 0
