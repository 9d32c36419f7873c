"""The gateway on its own (no workers, ``lone_gateway``): the checks of prompts, completions' and
chats': text that is not Unicode, over the context, several prompts, too many parts or messages."""

from __future__ import annotations

import base64
import json
import random

import httpx
import pytest

from dayzero.stack import Stack

from .conftest import KEY, MODEL


def _post_raw(gateway: Stack, path: str, body: dict) -> httpx.Response:
    """``body`` as JSON with non-ASCII escaped: a lone surrogate travels as ``"\\ud800"``."""
    headers = {**KEY, "content-type": "application/json"}
    return httpx.post(f"{gateway.url}{path}", content=json.dumps(body), headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("path", "messages"),
    [
        ("/v1/chat/completions", [{"role": "user", "content": "a \ud800"}]),
        ("/v1/chat/completions", [{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}]),
        ("/tokenize", [{"role": "user", "content": "a \ud800"}]),
    ],
)
def test_chat_text_that_is_not_unicode_is_refused_naming_its_field(lone_gateway, path, messages):
    r = _post_raw(lone_gateway, path, {"model": MODEL, "max_tokens": 3, "messages": messages})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content" and "lone surrogate" in error["message"], error


@pytest.mark.parametrize(
    ("prompt", "stream", "param"),
    [("a \udfff", False, "prompt"), ("a \udfff", True, "prompt"), (["ok", "a \udfff"], False, "prompt[1]")],
)
def test_a_completions_prompt_that_is_not_unicode_is_refused_naming_it(lone_gateway, prompt, stream, param):
    r = _post_raw(
        lone_gateway, "/v1/completions", {"model": MODEL, "max_tokens": 3, "prompt": prompt, "stream": stream}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "integer" not in r.json()["error"]["message"]  # not another prompt form's complaint


def test_a_chat_far_over_the_context_is_refused_from_its_size(lone_gateway):
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "x" * 300_000}]}
    r = httpx.post(f"{lone_gateway.url}/v1/chat/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    # BOS 29 + <｜User｜> 12 + 300000 + <｜Assistant｜> 17 + </think> 8 bytes; no demo model token stands for
    # over 12 bytes (" punctuation"), and at most 10 added ones (at its 4 "<" and 6 "｜") of at most 29
    at_least = 10 + -(-(29 + 12 + 300_000 + 17 + 8 - 10 * 29) // 12)
    assert r.json()["error"]["message"] == f"the prompt has at least {at_least} tokens; the context limit is 4096"
    assert r.json()["error"]["param"] == "messages"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_space_free_prompt_over_the_context_is_refused_from_its_first_pieces(lone_gateway, path):
    """40,000 characters of base64 against 4,096: under the byte bound (49,152 bytes at 12 a token) and
    no space for a head, it was tokenized whole and refused by its count ("the prompt has 39,6xx
    tokens"); now by its first piece's tokens (dayzero.prompt_pieces), the same 400 otherwise."""
    prompt = base64.b64encode(random.Random(0).randbytes(30_000)).decode()
    body = {"model": MODEL, "max_tokens": 3}
    body |= {"prompt": prompt} if path == "/v1/completions" else {"messages": [{"role": "user", "content": prompt}]}
    r = httpx.post(f"{lone_gateway.url}{path}", json=body, headers=KEY, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
    assert error["type"] == "invalid_request_error" and error["param"] == ("prompt" if "prompt" in body else "messages")
    assert error["message"].startswith("the prompt has at least ") and error["message"].endswith(" limit is 4096")


@pytest.mark.parametrize("prompt", [[5] * 5000, "hello " * 5000])
def test_a_completions_prompt_over_the_context_is_refused_naming_prompt(lone_gateway, prompt):
    body = {"model": MODEL, "max_tokens": 3, "prompt": prompt}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert r.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("prompt", "param", "message"),
    [
        ([[1, 2], []], "prompt[1]", "prompt 1: the prompt is empty"),
        ([[1], [-1]], "prompt[1]", "prompt 1: prompt token ids must be in [0, 512)"),
        ([[1], [2], [10**9]], "prompt[2]", "prompt 2: prompt token ids must be in [0, 512)"),
        ([[5] * 5000, [1]], "prompt[0]", "prompt 0: the prompt has 5000 tokens; the context limit is 4096"),
        (["text", [1]], "prompt", "prompt: prompt 1 is a token-id list and prompt 0 a string: the prompts must all"),
        ([[1], "text"], "prompt", "prompt: prompt 1 is a string and prompt 0 a token-id list: the prompts must all"),
        ([[1], None], "prompt", "prompt: prompt 1 is neither a string nor a token-id list and prompt 0 a token-id"),
        ([[1]] * 33, "prompt", "prompt: at most 32 prompts in one request"),
    ],
)
def test_several_prompts_are_refused_naming_the_one_at_fault(lone_gateway, prompt, param, message):
    """Token-id lists: which of several was empty, out of the vocabulary or over the context went
    unsaid (param "prompt"); prompts of mixed kinds were refused as the first union branch saw them
    ("prompt[0]: Input should be a valid integer" for ["text", [1]], whose prompt 0 is a string)."""
    body = {"model": MODEL, "max_tokens": 3, "prompt": prompt}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(message), error


def test_content_parts_and_tool_calls_are_bounded_in_all_messages_together(lone_gateway):
    """Each part and call is validated on the event loop before anything else runs: 256 messages of
    1,024 parts (7.9 MB) stalled every stream ~2 s, to be refused over the context after. At the
    bound (4,096), a chat of empty parts is taken (rendered, then refused for the context); one more
    is refused, counted before validation."""
    empty, call = {"type": "text", "text": ""}, {"id": "c", "type": "function", "function": {"name": "f"}}
    messages = [{"role": "user", "content": [empty] * 1024}] * 3 + [{"role": "user", "content": [empty] * 1023}]
    messages += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c", "content": ""}]
    body = {"model": MODEL, "messages": messages}
    at_bound = httpx.post(f"{lone_gateway.url}/tokenize", json=body, headers=KEY, timeout=30)  # rendered, counted:
    assert at_bound.json()["error"]["code"] == "context_length_exceeded", at_bound.text  # 8,249 tokens, over 4,096
    body["messages"] = [*messages, {"role": "user", "content": [empty]}]
    message = "messages: at most 4096 content parts and tool calls in all messages, not 4097"
    for path in ("/tokenize", "/v1/chat/completions"):
        r = httpx.post(f"{lone_gateway.url}{path}", json=body, headers=KEY, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "array_above_max_length",
        }


def test_too_many_messages_are_refused_before_their_parts_are_counted(lone_gateway):
    """The parts' count went through every message first: 2 M empty messages (8 MiB) were counted on
    the event loop for ~0.5 s before the messages' own bound refused them. Past 256 messages their
    bound answers, whatever the parts."""
    messages = [{"role": "user", "content": [{"type": "text", "text": ""}] * 16}] * 257  # 4,112 parts
    r = httpx.post(f"{lone_gateway.url}/tokenize", json={"model": MODEL, "messages": messages}, headers=KEY, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "messages: at most 256 items, not 257", r.json()
