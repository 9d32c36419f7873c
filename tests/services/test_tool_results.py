"""A chat's tool results must answer its calls as OpenAI's API requires (services/gateway/tool_results.py):
the tool messages right after an assistant message's calls answer each, by id, and no tool message
stands elsewhere (the gateway in-process, on a real Redis: each request here is refused before it
queues; /tokenize renders the same chat)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


ASKED = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [CALL]}]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            [{"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "user", "content": "q"}],
            "messages[0].role",
        ),
        (
            [*ASKED[:1], {"role": "assistant", "content": "a"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}],
            "messages[2].role",
        ),
        ([*ASKED, {"role": "tool", "tool_call_id": "zz", "content": "r"}], "messages[2].tool_call_id"),
        (
            [*ASKED, {"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "assistant", "content": "a"}]
            + [{"role": "tool", "tool_call_id": "c1", "content": "again"}],
            "messages[4].role",
        ),
    ],
    ids=["first", "after_a_reply", "unknown_id", "after_the_next_reply"],
)
def test_a_tool_message_that_answers_no_call_is_refused(gateway, messages, param):
    """As OpenAI and DeepSeek refuse it; it was rendered: a result of a call the model never made
    (an unknown id also put the results out of their calls' order)."""
    # (a max_tokens over the limit, refused after the body's checks: a body let through never queues)
    for path, fields in (("/v1/chat/completions", {"max_tokens": 10**6}), ("/tokenize", {})):
        r = gateway.post(path, json={"model": MODEL, "messages": messages, **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    answered = [*ASKED, {"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "user", "content": "more"}]
    r = gateway.post("/tokenize", json={"model": MODEL, "messages": answered})
    assert r.status_code == 200, r.text


TWO_CALLS = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [CALL, {**CALL, "id": "c2"}]}]


@pytest.mark.parametrize(
    ("messages", "unanswered"),
    [
        (ASKED, "'c1'"),  # the chat's last message
        ([*ASKED, {"role": "user", "content": "and?"}], "'c1'"),
        ([*ASKED, {"role": "user", "content": "and?"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}], "'c1'"),
        (
            [*TWO_CALLS, {"role": "tool", "tool_call_id": "c2", "content": "r"}, {"role": "user", "content": "q"}],
            "'c1'",
        ),
    ],
    ids=["last", "then_a_user", "answered_after_a_user", "one_of_two"],
)
def test_a_call_no_tool_message_answers_next_is_refused(gateway, messages, unanswered):
    """As OpenAI refuses it ("An assistant message with 'tool_calls' must be followed by tool messages
    responding to each 'tool_call_id'": BerriAI/litellm#10083). The encoder writes the results in the
    calls' order without their ids: c2's lone result was read as c1's; with none, the prompt ended on
    the calls' end of sentence, no assistant turn opened."""
    for path, fields in (("/v1/chat/completions", {"max_tokens": 10**6}), ("/tokenize", {})):
        r = gateway.post(path, json={"model": MODEL, "messages": messages, **fields})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("messages[1].tool_calls", "invalid_value"), error
        assert error["message"].endswith(f"none answers {unanswered}"), error
    answered = [*TWO_CALLS, *({"role": "tool", "tool_call_id": c, "content": "r"} for c in ("c2", "c1"))]
    assert gateway.post("/tokenize", json={"model": MODEL, "messages": answered}).status_code == 200


def test_a_history_call_without_an_id_is_refused(gateway):
    """OpenAI requires a call's id (a tool message answers it); a call without one was taken."""
    called = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    r = gateway.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "q"}, called]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("messages[1].tool_calls[0].id", "missing_required_parameter"), error


@pytest.mark.parametrize(
    "messages",
    [
        [*ASKED, *({"role": "tool", "tool_call_id": "c1", "content": r} for r in ("x", "y"))],
        [*TWO_CALLS, *({"role": "tool", "tool_call_id": c, "content": "r"} for c in ("c1", "c2", "c1"))],
    ],
    ids=["twice", "after_the_other"],
)
def test_a_second_result_of_one_call_is_refused(gateway, messages):
    """As OpenAI refuses it (400 "Duplicate value for 'tool_call_id' of 'call_...', in messages[7] and
    messages[8]": agno-agi/agno#5116; DeepSeek's API too); both results were rendered, the model shown
    two answers to one call."""
    for path, fields in (("/v1/chat/completions", {"max_tokens": 10**6}), ("/tokenize", {})):
        r = gateway.post(path, json={"model": MODEL, "messages": messages, **fields})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == (f"messages[{len(messages) - 1}].tool_call_id", "invalid_value"), (
            error
        )
        assert error["message"].endswith("'c1' is answered twice (duplicate value for 'tool_call_id')"), error


SAME_ID = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [CALL, CALL]}]


def test_calls_that_share_an_id_are_answered_by_one_result_or_one_each(gateway):
    """Some models and adapters give two calls of one turn the same id ("" too: an id). OpenAI's rule is
    by id ("tool messages responding to each 'tool_call_id'"; the calls left waiting are listed by id):
    one result answers the id, and it was refused here ("none answers 'c1'"); it is rendered as each
    call's (it was rendered once: the second call showed no result). The encoder writes the results in
    call order without ids, so two results answer them too, rendered as two calls' (c1 and c2); a third
    is refused. An id a new assistant turn reuses (call_0 each turn, as agent frameworks number them) is
    answered afresh."""
    results = [{"role": "tool", "tool_call_id": "c1", "content": r} for r in ("x", "y", "z")]
    shared = gateway.post("/tokenize", json={"model": MODEL, "messages": [*SAME_ID, *results[:2]]})
    two = [*TWO_CALLS, results[0], {**results[1], "tool_call_id": "c2"}]
    assert shared.status_code == 200, shared.text
    assert shared.json() == gateway.post("/tokenize", json={"model": MODEL, "messages": two}).json()
    r = gateway.post("/tokenize", json={"model": MODEL, "messages": [*SAME_ID, results[0]]})
    each = [*TWO_CALLS, results[0], {**results[0], "tool_call_id": "c2"}]
    assert r.status_code == 200, r.text
    assert r.json() == gateway.post("/tokenize", json={"model": MODEL, "messages": each}).json()
    r = gateway.post("/tokenize", json={"model": MODEL, "messages": [*SAME_ID, *results]})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (400, "messages[4].tool_call_id", "invalid_value"), r.text
    assert error["message"].endswith("'c1' is answered 3 times for its 2 calls (duplicate value for 'tool_call_id')")
    again = [*ASKED, results[0], ASKED[1], results[1], {"role": "user", "content": "q"}]
    assert gateway.post("/tokenize", json={"model": MODEL, "messages": again}).status_code == 200
