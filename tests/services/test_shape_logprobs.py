"""Logprobs in the completions format (in-process, no stack): its ``top_logprobs`` are keyed by the
tokens' names, so two pieces of characters (each U+FFFD as text) must not share one."""

from __future__ import annotations

import time

from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token
from services.gateway.shapes import Shape


def test_pieces_of_characters_are_named_by_their_bytes_and_keep_their_own_keys(codec):
    pieces = [t for t in range(codec.vocab_size) if codec.token_piece(t)[0] == "\ufffd"]
    first, second = pieces[:2]  # e.g. one character's first byte and another's
    request = GenerationRequest(
        request_id="r", prompt_ids=(1,), sampling=SamplingParams(max_tokens=2, logprobs=3), created=time.time()
    )
    top = ((first, -0.5), (second, -1.0), (codec.encode("a")[1], -2.0))
    token = Token("r", 0, first, "", "length", logprob=-0.5, top=top)
    logprobs = Shape(request, "m", codec).body("", "length", {}, [token])["choices"][0]["logprobs"]
    names = [f"bytes:\\x{codec.token_piece(t)[1][0]:02x}" for t in (first, second)]
    assert logprobs["tokens"] == names[:1]
    assert logprobs["top_logprobs"] == [{names[0]: -0.5, names[1]: -1.0, "a": -2.0}]  # was {"\ufffd": -1.0, "a": -2.0}


def test_text_offsets_start_past_the_u_fffd_of_bytes_a_token_does_not_continue(codec):
    """A token after held bytes it does not continue (a run of lead bytes; a cut character, then
    "b"; ED then BE, outside ED's range) begins after their U+FFFD: the offsets were [0, 0, 1] and
    [0, 1, 1] ("b" at the U+FFFD). A character's bytes over several tokens keep its start."""
    from ..test_tokenizer import _byte_token

    request = GenerationRequest(
        request_id="r", prompt_ids=(1,), sampling=SamplingParams(max_tokens=9, logprobs=0), created=time.time()
    )
    b = [_byte_token(codec, x) for x in (0xE4, 0xB8, 0xAD, 0xED, 0xBE)]
    a_, b_ = codec.encode("a", special=False), codec.encode("b", special=False)
    for ids, offsets in (
        ([b[0]] * 3, [0, 1, 2]),
        (a_ + [b[0]] + b_, [0, 1, 2]),
        ([b[3], b[4]] + b_, [0, 1, 2]),
        (a_ + b[:3] + b_, [0, 1, 1, 1, 2]),
    ):
        tokens = [Token("r", i, t, "", None, logprob=-0.1) for i, t in enumerate(ids)]
        body = Shape(request, "m", codec).body(codec.decode(ids), "length", {}, tokens)["choices"][0]
        assert body["logprobs"]["text_offset"] == offsets, ids
        assert body["text"][offsets[-1] :] == codec.decode(ids[-1:])  # the last token's text, at its offset
