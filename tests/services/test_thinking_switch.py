"""DeepSeek's own API turns thinking mode on and off with ``"thinking": {"type": "enabled" |
"disabled"}`` (its OpenAI format; the official SDK examples pass it in ``extra_body``). The gateway
in-process on a real Redis, no workers: /tokenize shows the prompt a chat is given."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

CHAT = [{"role": "user", "content": "Hi"}]
OPENS_A_THOUGHT, SKIPS_THE_THOUGHT = "<｜Assistant｜><think>", "<｜Assistant｜></think>"
# what DeepSeek-V4's 0731 table (the default without the checkpoint's own file) opens "high" with
HIGH = "Reasoning Effort: Absolute maximum with no shortcuts permitted."
MAX = "Reasoning Effort: Beyond maximum"


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _prompt(gateway, **body) -> str:
    r = gateway.post("/tokenize", json={"model": MODEL, "messages": CHAT, **body})
    assert r.status_code == 200, r.text
    return gateway.post("/detokenize", json={"model": MODEL, "tokens": r.json()["tokens"]}).json()["prompt"]


@pytest.mark.parametrize(
    "body, opened",
    [
        ({"thinking": {"type": "enabled"}}, True),
        ({"thinking": {"type": "disabled"}}, False),
        ({"thinking": {"type": "disabled"}, "reasoning_effort": "high"}, False),  # the switch decides
        ({"thinking": {"type": "enabled"}, "chat_template_kwargs": {"thinking": True}}, True),
        ({"thinking": None}, False),  # null: the default, chat mode
    ],
)
def test_deepseeks_switch_sets_thinking_mode(gateway, body, opened):
    prompt = _prompt(gateway, **body)
    assert prompt.endswith(OPENS_A_THOUGHT if opened else SKIPS_THE_THOUGHT), prompt


def test_the_effort_goes_with_deepseeks_switch(gateway):
    """DeepSeek's own example: ``reasoning_effort="high"`` with ``thinking`` enabled."""
    prompt = _prompt(gateway, thinking={"type": "enabled"}, reasoning_effort="high")
    assert prompt.startswith("<｜begin▁of▁sentence｜>" + HIGH) and prompt.endswith(OPENS_A_THOUGHT), prompt
    assert HIGH not in _prompt(gateway, thinking={"type": "enabled"})  # low, V4's default, adds nothing


@pytest.mark.parametrize(
    "effort, paragraph",
    [
        ("minimal", ""),
        ("low", ""),
        ("medium", HIGH),
        ("high", HIGH),
        ("xhigh", HIGH),
        ("max", MAX),
        ("ultra", MAX),
    ],
)
def test_each_effort_gets_the_level_deepseeks_api_maps_it_to(gateway, effort, paragraph):
    """DeepSeek's table (api-docs.deepseek.com, guides/thinking_mode): minimal and low -> low, medium
    to xhigh -> high, max and ultra -> max. Medium was read as low and xhigh as max, ultra refused."""
    prompt = _prompt(gateway, thinking={"type": "enabled"}, reasoning_effort=effort)
    opening = prompt.removeprefix("<｜begin▁of▁sentence｜>")
    assert opening.startswith(paragraph) and (paragraph or "Reasoning Effort" not in opening), prompt


@pytest.mark.parametrize(
    "body",
    [
        {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"thinking": False}},
        {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"thinking": True}},
        {"thinking": {"type": "adaptive"}},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},  # Anthropic's: would change the reply
        {"thinking": True},
    ],
)
@pytest.mark.parametrize("route", ["/tokenize", "/v1/chat/completions"])
def test_a_switch_this_server_cannot_follow_is_refused(gateway, route, body):
    r = gateway.post(route, json={"model": MODEL, "messages": CHAT, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].startswith("thinking"), error
    assert "True" not in error["message"] and "False" not in error["message"], error  # JSON's spelling


@pytest.mark.parametrize(
    "body, other",
    [
        ({"thinking": {"type": "enabled"}, "reasoning_effort": "none"}, "thinking 'enabled'"),
        ({"chat_template_kwargs": {"thinking": True}, "reasoning_effort": "none"}, "chat_template_kwargs.thinking"),
        (
            {"chat_template_kwargs": {"thinking": True, "reasoning_effort": "max"}, "reasoning_effort": "high"},
            "chat_template_kwargs.reasoning_effort 'max'",
        ),
    ],
)
@pytest.mark.parametrize("route", ["/tokenize", "/v1/chat/completions"])
def test_two_ways_of_asking_for_different_thinking_are_refused_naming_both(gateway, route, body, other):
    """They were settled silently: the switch turned thinking on beside an effort of "none", and
    chat_template_kwargs' effort won over a different reasoning_effort."""
    r = gateway.post(route, json={"model": MODEL, "messages": CHAT, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "reasoning_effort" and other in error["message"], error


@pytest.mark.parametrize(
    "body, opened",
    [
        ({"thinking": {"type": "disabled"}, "reasoning_effort": "none"}, False),
        ({"chat_template_kwargs": {"thinking": False}, "reasoning_effort": "max"}, False),  # the switch decides
        ({"chat_template_kwargs": {"thinking": True, "reasoning_effort": "max"}, "reasoning_effort": "ultra"}, True),
        ({"chat_template_kwargs": {"thinking": True, "reasoning_effort": "low"}, "reasoning_effort": "minimal"}, True),
    ],
)
def test_agreeing_ways_and_a_switch_turning_thinking_off_are_taken(gateway, body, opened):
    prompt = _prompt(gateway, **body)
    assert prompt.endswith(OPENS_A_THOUGHT if opened else SKIPS_THE_THOUGHT), prompt
