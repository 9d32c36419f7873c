"""The stream's wire format as the official openai client reads it (its own SSE decoder)."""

from __future__ import annotations

import json

from openai._streaming import SSEDecoder
from sse_starlette.sse import ServerSentEvent

from services.gateway.event_streams import KEEP_ALIVE, retry_line


def test_retry_and_keep_alives_are_no_events_to_the_openai_client():
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    wire = b"".join(
        [
            retry_line(1000),  # rides on the first event
            ServerSentEvent(id="0-0", data=chunk).encode(),
            KEEP_ALIVE,  # a long pause between tokens, after an event id was seen
            KEEP_ALIVE,
            ServerSentEvent(id="1-0", data=chunk).encode(),
            KEEP_ALIVE,
            ServerSentEvent(data="[DONE]").encode(),
        ]
    )
    events = list(SSEDecoder().iter_bytes(iter([wire])))  # the client parses every event's data as JSON
    assert [e.data for e in events] == [chunk, chunk, "[DONE]"] and [e.id for e in events][:2] == ["0-0", "1-0"]
    assert events[0].retry == 1000
    # what a retry or comment event with its own blank line gives that client: empty events
    bad = ServerSentEvent(retry=1000).encode() + ServerSentEvent(id="0-0", data=chunk).encode()
    bad += ServerSentEvent(comment="keep-alive").encode()
    assert [e.data for e in SSEDecoder().iter_bytes(iter([bad]))] == ["", chunk, ""]
