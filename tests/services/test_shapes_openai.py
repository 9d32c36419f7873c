"""Every chunk and body the gateway's shapes write, read by the ``openai`` package's own types (in-process,
no stack): each validates, holds no field those types lack but this server's documented extensions,
and carries what OpenAI's streams always carry: each choice's ``logprobs`` and ``finish_reason``,
null when there is nothing (the API reference's examples; its types leave both optional), and the
first chat chunk's ``refusal: null`` beside its role."""

from __future__ import annotations

import time

import pytest
from openai import BaseModel
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token
from services.gateway.outcome import Usage
from services.gateway.shapes import Shape

EXTENSIONS = {"reasoning_content", "token_ids"}  # DeepSeek's thinking, vLLM's ids (README)
FINGERPRINT = "fp_0123456789ab"


def _extra_fields(model: object, where: str = "") -> list[str]:
    """The fields of a parsed ``model`` (and the models it holds) that its type does not declare."""
    if isinstance(model, list):
        return [f for i, item in enumerate(model) for f in _extra_fields(item, f"{where}.{i}")]
    if not isinstance(model, BaseModel):
        return []
    extra = [f"{where}.{name}" for name in model.model_extra or {} if name not in EXTENSIONS]
    held = [_extra_fields(getattr(model, name), f"{where}.{name}") for name in type(model).model_fields]
    return extra + [f for fields in held for f in fields]


def _stream(codec, kind: str, logprobs: int | None) -> list[dict]:
    """A stream's chunks as event_streams sends them: the role (chat), two tokens, the usage."""
    request = GenerationRequest(
        request_id="r",
        kind=kind,
        prompt_ids=(1,),
        sampling=SamplingParams(max_tokens=2, logprobs=logprobs),
        created=time.time(),
        usage_in_stream=True,
    )
    shape = Shape(request, "m", codec, FINGERPRINT)
    a, b = codec.encode("a")[1], codec.encode("b")[1]
    tokens = [Token("r", 0, a, "a", None, logprob=-0.5, top=((b, -1.0),)), Token("r", 1, b, "b", "stop", logprob=-1.0)]
    chunks = [shape.chunk(None, None, role=True)] if kind == "chat" else []
    chunks += [shape.chunk("a", None, tokens=tokens[:1]), shape.chunk("b", "stop", tokens=tokens[1:])]
    return [*chunks, shape.usage_chunk(Usage())]


@pytest.mark.parametrize("logprobs", [None, 2], ids=["no_logprobs", "logprobs"])
def test_chat_chunks_read_as_openai_writes_them(codec, logprobs):
    chunks = _stream(codec, "chat", logprobs)
    for chunk in chunks:
        assert _extra_fields(ChatCompletionChunk.model_validate(chunk)) == [], chunk
    choices = [chunk["choices"][0] for chunk in chunks[:-1]]
    assert all(c.keys() >= {"index", "delta", "logprobs", "finish_reason"} for c in choices), choices
    assert chunks[0]["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": "", "refusal": None},
        "logprobs": None,
        "finish_reason": None,
    }
    assert [c["logprobs"] is None for c in choices] == [True, logprobs is None, logprobs is None]


@pytest.mark.parametrize("logprobs", [None, 2], ids=["no_logprobs", "logprobs"])
def test_completion_chunks_read_as_openai_writes_them(codec, logprobs):
    chunks = _stream(codec, "completion", logprobs)
    for chunk in chunks:
        # (OpenAI's type has no null finish_reason; its streams send null until the last chunk)
        last = {**chunk, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]]}
        assert _extra_fields(Completion.model_validate(last)) == [], chunk
    choices = [chunk["choices"][0] for chunk in chunks[:-1]]
    assert all(c.keys() >= {"index", "text", "logprobs", "finish_reason"} for c in choices), choices
    assert [c["logprobs"] is None for c in choices] == [logprobs is None, logprobs is None]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_bodies_read_as_openai_writes_them(codec, kind):
    request = GenerationRequest(request_id="r", kind=kind, prompt_ids=(1,), sampling=SamplingParams(), created=1.0)
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    body = Shape(request, "m", codec, FINGERPRINT).body("a", "stop", usage, [])
    parsed = (ChatCompletion if kind == "chat" else Completion).model_validate(body)
    assert _extra_fields(parsed) == [] and body["choices"][0]["logprobs"] is None
    assert parsed.system_fingerprint == FINGERPRINT


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_every_chunk_names_the_backend_as_openai_s_do(codec, kind):
    """OpenAI's chunks and bodies carry system_fingerprint (LangChain reads it off the chunk with the
    finish_reason); none did."""
    chunks = _stream(codec, kind, None)
    assert [c["system_fingerprint"] for c in chunks] == [FINGERPRINT] * len(chunks)
