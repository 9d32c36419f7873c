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
