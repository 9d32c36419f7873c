"""A chat's messages: their content parts (text, images), an assistant's calls in the history, and
what each role must carry."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from .body_model import _Body
from .schemas import MAX_TEXT, Text

MAX_PARTS = 1024  # content parts of a message (its images are bounded further)


class TextPart(_Body):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ImageURL(_Body):
    url: str = Field(max_length=16 << 20)
    detail: str | None = Field(default=None, max_length=16)  # OpenAI's auto | low | high: accepted, ignored


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Body):
    """A call in the chat's history, rendered as V4 writes one: ``invoke name="NAME"`` and a
    ``parameter name="KEY"`` per argument, with no escape: a name or key holding a quote or a
    ``<`` would show the model markup its calls never have (the reply parser reads back what they
    may hold: ``chat/dsml.py``)."""

    name: str = Field(pattern=r'^[^"<]{0,256}$')  # any call's name (earlier calls may be other tools')
    arguments: str = Field(default="{}", max_length=MAX_TEXT)  # a JSON object

    @field_validator("arguments")
    @classmethod
    def _keys_fit_the_call_format(cls, arguments: str) -> str:
        try:
            values = json.loads(arguments)
        except (ValueError, RecursionError):  # rendered as one "arguments" parameter, as DeepSeek's encoder does
            return arguments
        for key in values if isinstance(values, dict) else ():
            if '"' in key or "<" in key:
                raise ValueError(f"argument name {key!r}: a call's argument names cannot carry '\"' or '<'")
        return arguments


class ToolCall(_Body):
    id: str | None = Field(default=None, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    list_limits = {"content": MAX_PARTS}
    role: Literal["system", "user", "assistant", "developer", "tool", "latest_reminder"]
    # each kind its own bound (one on the union told a long string "at most 1048576 items")
    content: Text | Annotated[list[Part], Field(min_length=1)] | None = Field(default=None, validate_default=True)
    reasoning_content: str | None = Field(default=None, max_length=MAX_TEXT)  # an assistant's (DeepSeek's field)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=256)
    prefix: bool | None = None  # DeepSeek's chat prefix completion: the answer's beginning, continued

    @field_validator("content")
    @classmethod
    def _content_unless_an_assistant_s(cls, content: object, info: ValidationInfo) -> object:
        """Required but of an assistant (OpenAI's rule); left out or null it was served as an empty turn."""
        role = info.data.get("role")
        if content is None and role not in (None, "assistant"):
            raise PydanticCustomError("missing", "a {role} message needs content", {"role": role})
        return content
