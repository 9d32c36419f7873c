"""A stream's ``finish_reason`` rides its last token's chunk (vLLM's shape; OpenAI sends it on a
chunk of its own, with an empty delta), so that each chunk is one stream entry, one SSE event a
client can resume after. The openai SDK's stream helper (``client.chat.completions.stream``:
events, ``get_final_completion()``) reads the chunks one by one: it must end a stream of this
shape as it ends OpenAI's. On the shared stack, greedy, beside the same request unstreamed."""

from __future__ import annotations

import pytest

from .chat_requests import openai_client
from .conftest import MODEL

HI = [{"role": "user", "content": "Hi"}]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}, "required": ["city"]}
STRICT_TOOL = {"type": "function", "function": {"name": "get_w", "strict": True, "parameters": CITY}}
YES_NO = {  # no other keys: else a random model adds some until max_tokens
    "type": "object",
    "properties": {"yes": {"type": "boolean"}},
    "required": ["yes"],
    "additionalProperties": False,
}
ANSWER = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": YES_NO}}


def _reply(message) -> tuple:
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content or None, calls


@pytest.mark.parametrize(
    "ask, done",
    [
        ({"stop": ["e", "a", "o", "i"]}, "content.done"),
        ({"tools": [STRICT_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_w"}}}, "tool_calls"),
        ({"response_format": ANSWER}, "content.done"),
    ],
    ids=["text", "named_tool", "json_schema"],
)
def test_the_sdks_stream_helper_ends_these_streams_as_openais(stack, ask, done):
    client = openai_client(stack)
    body = {"model": MODEL, "messages": HI, "max_tokens": 200, "temperature": 0, **ask}
    whole = client.chat.completions.create(**body).choices[0]
    with client.chat.completions.stream(**body, stream_options={"include_usage": True}) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    assert whole.finish_reason in ("stop", "tool_calls"), whole  # ended, not cut: the helper parses it
    assert final.choices[0].finish_reason == whole.finish_reason
    assert _reply(final.choices[0].message) == _reply(whole.message)
    ended = "tool_calls.function.arguments.done" if done == "tool_calls" else done
    assert events.count(ended) == 1 and final.usage is not None, events
