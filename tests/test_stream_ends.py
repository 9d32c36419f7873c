"""A completion's text at its ends: every end (EOS, max_tokens, the time limit, a request that
waited past it) releases what its tokens held back and matches the stop strings in it, as vLLM
matches them on the detokenized text, its final flush included; a byte-fallback tokenizer's
stream is transformers' decode of the same ids."""

from __future__ import annotations

from dayzero.completion import Completion
from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.time_limit import past_limit

from .test_tokenizer import _byte_token

EOS = (1,)


def _streamed(codec, sampling: SamplingParams, ids: list[int]) -> tuple[str, str | None]:
    """The text a completion streams for ``ids`` (the last of them ends it, or none does) and its
    finish reason."""
    completion, text = Completion(codec, sampling, EOS, 2, 4096), ""
    for token in ids:
        step = completion.accept(token)
        text += step.text
        if step.finish_reason:
            return text, step.finish_reason
    return text, None


def test_a_stop_string_the_cut_characters_u_fffd_completes_ends_every_end_alike(codec):
    """"Hi" then 中's lead byte (0xE4, a character cut short: U+FFFD at the end) with stop
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
    """"Hi" with stop "ix": "i" is held as the stop string's start; a request that waited past the
    time limit ends with it, as a token limit does ("Hi", finish "length")."""
    ids = codec.encode("Hi", special=False)
    sampling = SamplingParams(max_tokens=9, stop=("ix",))
    streamed, _ = _streamed(codec, sampling, ids)
    request = GenerationRequest(request_id="w", prompt_ids=(0, 5), sampling=sampling, created=0.0)
    end = past_limit(codec, request, ids, 1.0)
    assert (streamed + end.text, end.reason) == ("Hi", "length")
    assert _streamed(codec, SamplingParams(max_tokens=len(ids), stop=("ix",)), ids) == ("Hi", "length")
