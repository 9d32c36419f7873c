"""What the server refuses gets OpenAI's error naming it: bad values, bodies and images (400; 413
past the size limit), and what the server does not implement, never silently ignored: the OpenAI
parameters it lacks (at values that ask for them) and one image over the per-image pixel limit (the
same code as a request's images over theirs)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
from PIL import Image

from dayzero.vision.images import ImageLimits, PatchSpec, probe
from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.errors import APIError
from services.gateway.images import render_chat
from services.gateway.schemas import CompletionRequest

from .conftest import MODEL, chat, data_url

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
NAMELESS = "response_format.json_schema.name"  # OpenAI requires it (it was optional here)


ONLY_NONE = 'is not supported by this server (only "none"); use tool_choice'
NOT_TEXT = 'other than ["text"] are not supported by this server'
# harmless fields clients commonly send, and a typo: accepted (and ignored), as vLLM does
COMMON = {"user": "u-1", "store": False, "metadata": {"k": "v"}, "service_tier": "auto", "max_token": 3}


@pytest.mark.parametrize(
    ("field", "served", "refused", "why"),
    [
        ("function_call", {"function_call": "none"}, "auto", ONLY_NONE),
        ("function_call", {"function_call": None}, {"name": "f"}, ONLY_NONE),
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
    error = {"message": message, "type": "invalid_request_error", "param": field, "code": "unsupported_value"}
    assert r.json() == {"error": error}


VLLM_ONLY = "(vLLM's) is not supported by this server"
SGLANG_ONLY = "(SGLang's) is not supported by this server"


@pytest.mark.parametrize(
    ("field", "default", "refused", "why"),
    [
        ("guided_json", None, {"type": "object"}, f"{VLLM_ONLY}; use response_format"),
        ("guided_choice", None, ["a", "b"], f"{VLLM_ONLY}; use response_format"),
        ("structured_outputs", None, {"json": {"type": "object"}}, f"{VLLM_ONLY}; use response_format"),
        ("min_tokens", 0, 8, f"other than 0 {VLLM_ONLY}"),
        ("min_p", 0.0, 0.1, f"other than 0 {VLLM_ONLY}"),
        ("repetition_penalty", 1.0, 1.2, f"other than 1 {VLLM_ONLY}; use presence_penalty or frequency_penalty"),
        ("stop_token_ids", [], [1], f"{VLLM_ONLY}; use stop"),
        ("bad_words", [], ["x"], f"{VLLM_ONLY}; use logit_bias"),
        ("allowed_token_ids", None, [1, 2], f"{VLLM_ONLY}; use logit_bias"),
        ("use_beam_search", False, True, VLLM_ONLY),
        ("include_stop_str_in_output", False, True, VLLM_ONLY),
        ("skip_special_tokens", True, False, f"false {VLLM_ONLY}"),
        ("prompt_logprobs", None, 1, VLLM_ONLY),
        ("regex", None, "[ab]+", f"{SGLANG_ONLY}; use response_format"),
        ("json_schema", None, '{"type": "object"}', f"{SGLANG_ONLY}; use response_format"),
    ],
)
def test_engine_extensions_that_change_the_reply_are_refused(stack, field, default, refused, why):
    """vLLM's and SGLang's extensions were ignored as unknown fields are: a vLLM client's guided_json
    (SGLang's regex) got unconstrained text with 200. At their defaults they ask for nothing and are
    served."""
    for path, body in (
        ("/v1/chat/completions", chat("x", max_tokens=1)),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1}),
    ):
        r = httpx.post(f"{stack.url}{path}", json={**body, field: default}, timeout=60)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{stack.url}{path}", json={**body, field: refused}, timeout=30)
        assert r.status_code == 400, r.text
        message = f"{field}: {field} {why}"
        assert r.json() == {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": field,
                "code": "unsupported_value",
            }
        }


def test_vllm_and_sglang_defaults_their_clients_send_are_served():
    """vLLM's and SGLang's clients send their sampling defaults; top_k -1 (every token, theirs) was
    refused with 400 ("greater than or equal to 0") though top_k is accepted "as in vLLM"."""
    defaults = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0, "stop_token_ids": []}
    defaults |= {"skip_special_tokens": True, "spaces_between_special_tokens": True}
    for kind, body in ((ChatCompletionRequest, chat("x")), (CompletionRequest, {"model": MODEL, "prompt": "x"})):
        assert kind.model_validate({**body, **defaults}).top_k == 0


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
        "param": "messages[0].content[1].image_url.url",
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
    assert refused == (400, "messages[0].content[2].image_url.url", "too_many_image_pixels")  # the second's
    assert over.value.message == "image of 30x20 pixels exceeds the limit of 500"
    assert len(render_chat(messages, ImageLimits(max_pixels=600), PatchSpec(), True).images) == 2
    with pytest.raises(TooManyPixels, match="exceeds the limit of 40000000 decoded pixels"):
        probe(_png(10000, 9000), ImageLimits())


def _rendered(urls: list[str], limits: ImageLimits):
    return render_chat(ChatCompletionRequest(**_image_chat(*urls)).messages, limits, PatchSpec(), True)


def test_summed_image_pixels_are_refused_from_the_headers_before_decoding():
    """In-process: three 20x20 images are 1200 pixels. Their pixel data is cut off, so only a check
    from the headers can refuse them as over budget; at the budget they reach the decoder."""
    from ..vision.conftest import encoded

    cut = [_url(encoded(20, 20, seed=i)[:100]) for i in range(3)]
    with pytest.raises(APIError) as over:
        _rendered(cut, ImageLimits(max_total_pixels=1199))
    assert (over.value.status, over.value.param, over.value.code) == (400, "messages", "too_many_image_pixels")
    assert over.value.message == "1200 image pixels (width x height, summed) in one request; the limit is 1199"
    with pytest.raises(APIError) as at_budget:
        _rendered(cut, ImageLimits(max_total_pixels=1200))
    assert (at_budget.value.code, at_budget.value.param) == ("invalid_image", "messages[0].content[1].image_url.url")
    whole = [data_url(20, 20, i) for i in range(3)]
    assert len(_rendered(whole, ImageLimits(max_total_pixels=1200)).images) == 3


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (chat("x", model="other"), 404, "model"),
        (chat("x", temperature=5), 400, "temperature"),
        (chat("x", max_tokens=0), 400, "max_tokens"),
        (chat("x", max_tokens="4"), 400, "max_tokens"),  # strict types: no coercion
        (chat("x", stream="yes"), 400, "stream"),
        (chat("x", max_tokens=100_000), 400, "max_tokens"),
        (chat("x", n=9), 400, "n"),
        ({"model": MODEL, "prompt": ["a"] * 33}, 400, "prompt"),
        (chat("x", stop=["a"] * 1 + [""]), 400, "stop[1]"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400, None),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, None),
        ({"model": MODEL, "prompt": [0, 99999]}, 400, "prompt"),
        ({"model": MODEL, "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
        (chat("x", tool_choice="required"), 400, "tool_choice"),  # without tools
        (chat("x", response_format={"type": "json_schema"}), 400, "response_format"),  # without a schema
        (chat("x", response_format={"type": "json_schema", "json_schema": {"schema": {}}}), 400, NAMELESS),
        (chat("x", logit_bias={"05": 1}), 400, "logit_bias"),  # was token 5 ("5" is: OpenAI's spelling)
        (chat("x", functions=[{"name": "f"}]), 400, "functions"),  # the legacy spelling: use tools
        (chat("x", top_logprobs=3), 400, "top_logprobs"),  # without logprobs: true
        (chat("x", logprobs=True, top_logprobs=21), 400, "top_logprobs"),
        ({"model": MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs"),
        (chat("x", presence_penalty=3), 400, "presence_penalty"),
        (chat("x", echo=True), 400, "echo"),
        ({"model": MODEL, "prompt": "x", "best_of": 3}, 400, "best_of"),
        ({"model": MODEL, "prompt": "word " * 5000}, 400, "prompt"),
        (
            {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                    }
                ],
            },
            400,
            "messages[0].content[0].image_url.url",
        ),
    ],
)
def test_bad_requests_get_openai_errors(stack, body, status, param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = httpx.post(f"{stack.url}{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param


def test_malformed_and_oversized_bodies(stack):
    r = httpx.post(
        f"{stack.url}/v1/chat/completions",
        content=b"{not json",
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "error" in r.json()
    big = json.dumps(chat("y" * 70_000)).encode()
    r = httpx.post(
        f"{stack.url}/v1/chat/completions", content=big, timeout=30, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    chunked = httpx.post(  # no Content-Length: the limit holds on the bytes as they come
        f"{stack.url}/v1/chat/completions",
        content=iter([big[:40_000], big[40_000:]]),
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "body_too_large"


def test_bad_images_are_refused_with_400(stack):
    def ask(url: str) -> httpx.Response:
        content = [{"type": "image_url", "image_url": {"url": url}}]
        return httpx.post(
            f"{stack.url}/v1/chat/completions",
            timeout=30,
            json={"model": MODEL, "messages": [{"role": "user", "content": content}]},
        )

    for url, code in (
        ("https://example.com/a.png", "invalid_image"),
        ("data:image/png;base64,AAAA", "invalid_image"),
        ("data:image/png;base64,@@", "invalid_image"),
    ):
        r = ask(url)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
