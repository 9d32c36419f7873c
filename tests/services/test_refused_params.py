"""What the server does not implement is refused with a 400 naming it, never silently ignored: the
OpenAI parameters it lacks (at values that ask for them) and one image over the per-image pixel
limit (the same code as a request's images over theirs)."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import Image

from dayzero.vision.images import ImageLimits, PatchSpec, probe
from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.errors import APIError
from services.gateway.images import render_chat

from .conftest import MODEL, chat

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


ONLY_NONE = 'is not supported by this server (only "none"); use tool_choice'
NOT_TEXT = 'other than ["text"] are not supported by this server'
# harmless fields clients commonly send, and a typo: accepted (and ignored), as vLLM does
COMMON = {"user": "u-1", "store": False, "metadata": {"k": "v"}, "service_tier": "auto", "max_token": 3}


@pytest.mark.parametrize(
    ("field", "served", "refused", "why"),
    [
        ("function_call", {"function_call": "none"}, "auto", ONLY_NONE),
        ("function_call", {"function_call": None}, {"name": "f"}, ONLY_NONE),
        (
            "parallel_tool_calls",
            {"parallel_tool_calls": True, "tools": [TOOL]},
            False,
            "false is not supported by this server: a reply may call several tools",
        ),
        ("modalities", {"modalities": ["text"]}, ["text", "audio"], NOT_TEXT),
        ("modalities", {"modalities": []}, ["audio"], NOT_TEXT),
        ("audio", {"audio": None}, {"voice": "alloy", "format": "wav"}, "output is not supported by this server"),
        (
            "prediction",
            {"prediction": None},
            {"type": "content", "content": "x"},
            "(predicted outputs) is not supported by this server",
        ),
        ("verbosity", {"verbosity": "medium"}, "low", 'other than "medium" is not supported by this server'),
        (
            "web_search_options",
            {"web_search_options": None},
            {},
            "is not supported by this server: it does not search the web",
        ),
    ],
)
def test_unimplemented_chat_parameters_are_refused_when_they_ask_for_something(stack, field, served, refused, why):
    url = f"{stack.url}/v1/chat/completions"
    r = httpx.post(url, json=chat("x", max_tokens=1, **served, **COMMON), timeout=60)  # asks for nothing more
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls")
    r = httpx.post(url, json=chat("x", max_tokens=1, **{field: refused}, **COMMON), timeout=30)
    assert r.status_code == 400, r.text
    message = f"{field}: {field} {why}"  # the gateway's "<param>: <why>", as for every invalid field
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error", "param": field, "code": None}}


def test_they_are_refused_by_completions_too(stack):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "function_call": {"name": "f"}}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "function_call", r.text


def _png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, "PNG")  # a blank bilevel image: a few KB at any size
    return buf.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _image_chat(*urls: str) -> dict:
    parts = [{"type": "text", "text": "what is it?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 1}


def test_one_image_over_the_pixel_limit_is_too_many_image_pixels(stack):
    """7000x6000 = 42,000,000 pixels, over the default per-image limit (40,000,000) but not the summed one."""
    r = httpx.post(f"{stack.url}/v1/chat/completions", json=_image_chat(_url(_png(7000, 6000))), timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": "image of 7000x6000 pixels exceeds the limit of 40000000",
        "type": "invalid_request_error",
        "param": "messages.0.content",
        "code": "too_many_image_pixels",
    }


def test_the_per_image_limit_holds_in_process_and_at_pillows_bomb_check():
    """Each image is checked on its own (the second's 30x20 = 600 > 500), before the summed budget;
    one past Pillow's own bomb limit (about 89M pixels) is refused as over the limit too."""
    from dayzero.vision.images import TooManyPixels

    small, big = _url(_png(20, 20)), _url(_png(30, 20))
    messages = ChatCompletionRequest(**_image_chat(small, big)).messages
    with pytest.raises(APIError) as over:
        render_chat(messages, ImageLimits(max_pixels=500), PatchSpec(), True)
    refused = (over.value.status, over.value.param, over.value.code)
    assert refused == (400, "messages.0.content", "too_many_image_pixels")
    assert over.value.message == "image of 30x20 pixels exceeds the limit of 500"
    assert len(render_chat(messages, ImageLimits(max_pixels=600), PatchSpec(), True).images) == 2
    with pytest.raises(TooManyPixels, match="exceeds the limit of 40000000 decoded pixels"):
        probe(_png(10000, 9000), ImageLimits())
