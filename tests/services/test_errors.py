"""OpenAI-style error bodies: the shape, and nothing of the process's memory in the message."""

from __future__ import annotations

from services.gateway.errors import error_body


def test_error_bodies_have_openai_shape_and_no_memory_addresses():
    body = error_body("bad value <services.gateway.schemas.Message object at 0x7f3a2b1c9d10>", "invalid_request_error")
    assert body == {
        "error": {
            "message": "bad value <services.gateway.schemas.Message>",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
