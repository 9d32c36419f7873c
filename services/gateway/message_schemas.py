"""A chat's messages: their content parts (text, images), an assistant's refusal and calls in the
history, and what each role must carry."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .body_model import _Body, coded, field_error
from .schemas import MAX_TEXT, Text

MAX_PARTS = 1024  # content parts of a message (its images are bounded further)


class TextPart(_Body):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ImageURL(_Body):
    url: str = Field(max_length=16 << 20)
    # OpenAI's (its API's enum): accepted, ignored; another value was taken too (OpenAI: invalid_value)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL


class RefusalPart(_Body):
    """An assistant's refusal in the history (OpenAI's assistant content parts are text or refusal),
    rendered as its text, as vLLM renders it."""

    type: Literal["refusal"]
    refusal: str = Field(max_length=MAX_TEXT)


Part = Annotated[TextPart | ImagePart | RefusalPart, Field(discriminator="type")]
# the content part types each role takes (OpenAI's: images are a user's, refusals an assistant's)
PART_TYPES = {"user": ("text", "image_url"), "assistant": ("text", "refusal")}
OTHER_ROLES_PART_TYPES = ("text",)
# OpenAI's user content parts this server does not serve (no audio encoder, no file reader), by type;
# each was told as if of no OpenAI type (invalid_value, "... are of type 'text' or 'image_url'")
UNSERVED_PART_TYPES = {"input_audio": "(audio input)", "file": "(a file's contents)"}
# the role whose messages alone take a part type, named to a part sent in another role's (text: every role's)
PART_OWNERS = dict.fromkeys(UNSERVED_PART_TYPES, "user") | {
    kind: role for role, kinds in PART_TYPES.items() for kind in kinds if kind != "text"
}


def part_text(part: str | Part) -> str | None:
    """The text a part renders as; None for an image."""
    if isinstance(part, str):
        return part
    return part.text if isinstance(part, TextPart) else part.refusal if isinstance(part, RefusalPart) else None


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
    id: str = Field(max_length=256)  # (OpenAI requires it: a tool message answers it)
    type: Literal["function"] = "function"
    function: FunctionCall


# the fields each role needs, and what each holds
NEEDED = {
    "content": ("system", "user", "developer", "tool", "latest_reminder"),
    "tool_call_id": ("tool",),
    "name": ("function",),
}
NEEDED_KINDS = {
    "content": "a string or an array of content parts",
    "tool_call_id": "the id of the call it answers",
    "name": "the name of the function whose result it is",
}
# the field of a result's message that names the call it answers: a tool's, a function's (OpenAI's deprecated role)
ANSWERING = {"tool": "tool_call_id", "function": "name"}


class Message(_Body):
    list_limits = {"content": MAX_PARTS}
    role: Literal["system", "user", "assistant", "developer", "tool", "latest_reminder", "function"]
    # each kind its own bound (one on the union told a long string "at most 1048576 items")
    content: Text | Annotated[list[Part], Field(min_length=1)] | None = Field(default=None, validate_default=True)
    reasoning_content: str | None = Field(default=None, max_length=MAX_TEXT)  # an assistant's (DeepSeek's field)
    refusal: str | None = Field(default=None, max_length=MAX_TEXT)  # an assistant's (OpenAI's field): rendered_parts
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    # an assistant's one call in OpenAI's deprecated form, rendered as that call (calls())
    function_call: FunctionCall | None = None
    tool_call_id: str | None = Field(default=None, max_length=256, validate_default=True)
    # a participant's name (given to a Jinja template; V4's encoding, as DeepSeek's, has no place for
    # one); a function message's: the function's, which answers the call of that name (calls())
    name: str | None = Field(default=None, max_length=256, validate_default=True)
    audio: dict | None = None  # an assistant's past audio reply (OpenAI's): refused, no audio is made here
    prefix: bool | None = None  # DeepSeek's chat prefix completion: the answer's beginning, continued

    @model_validator(mode="before")
    @classmethod
    def _needed_fields_are_not_null(cls, data: object) -> object:
        """A field the role needs, sent as null, is of the wrong type (OpenAI: "expected a string,
        got null"), not left out; checked before _Body takes a null as the default (left out)."""
        role = data.get("role") if isinstance(data, dict) else None
        if null := next((f for f, roles in NEEDED.items() if role in roles and f in data and data[f] is None), None):
            message = f"a {role} message needs {null}: {NEEDED_KINDS[null]}, not null"
            raise field_error(cls, (null,), message, None, kind="invalid_type")
        return data

    @field_validator("content", "tool_call_id", "name")
    @classmethod
    def _needed_by_the_role(cls, value: object, info: ValidationInfo) -> object:
        """Content but of an assistant's, a tool result's call id, a function result's name (OpenAI's
        rules): left out, a message was served as an empty turn, a result without an id as the first
        call's."""
        role = info.data.get("role")
        if value is None and role in NEEDED[info.field_name]:
            raise PydanticCustomError(
                "missing", "a {role} message needs {field}", {"role": role, "field": info.field_name}
            )
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _parts_fit_the_role(cls, content: object, info: ValidationInfo) -> object:
        """A part of a type the role does not take (OpenAI's rule: a user's parts are text or images,
        an assistant's text or refusals, the others' text), told the role's types: an image in a
        system or assistant message was encoded and shown to the model in that turn, and a type of
        no part was told every role's. Read before the parts are validated; a list past its bound is
        refused unread. A type of no string (3, a list, null) is told them too: the union told every
        role's; null keeps its code (a required field's null: invalid_type)."""
        role = info.data.get("role")
        if role is None or not isinstance(content, list) or len(content) > MAX_PARTS:
            return content
        types = PART_TYPES.get(role, OTHER_ROLES_PART_TYPES)
        for j, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part or (kind := part["type"]) in types:
                continue  # (no object, no type: the union tells it)
            told, named = " or ".join(map(repr, types)), isinstance(kind, str)  # (a list, an object: no key)
            if role == "user" and named and kind in UNSERVED_PART_TYPES:  # (OpenAI's: valid, not served here)
                message = f"type {kind!r} {UNSERVED_PART_TYPES[kind]} is not supported by this server: send {told}"
                raise field_error(cls, (j, "type"), message, kind, "unsupported_value")
            shown = repr(kind) if named else json.dumps(kind)  # (3, ["text"], null: as sent)
            message = f"content parts of a message with role {role!r} are of type {told}, not {shown}"
            if owner := PART_OWNERS.get(kind) if named else None:
                message += f" ({kind} parts are only allowed in messages with role {owner!r})"
            raise field_error(cls, (j, "type"), message, kind, "invalid_type" if kind is None else "value_error")
        return content

    @field_validator("refusal")
    @classmethod
    def _refusal_is_an_assistant_s(cls, refusal: str | None, info: ValidationInfo) -> str | None:
        """OpenAI's assistant messages carry a refusal (no other role's does: as a refusal part)."""
        if refusal is not None and info.data.get("role") != "assistant":
            raise ValueError(f"only an assistant message carries a refusal, not a {info.data.get('role')} message")
        return refusal

    @field_validator("function_call")
    @classmethod
    def _one_form_of_calls(cls, call: FunctionCall, info: ValidationInfo) -> FunctionCall:
        """An assistant's, in place of tool_calls (it was dropped: the turn rendered empty)."""
        if (role := info.data.get("role")) != "assistant":
            raise ValueError(f"only an assistant message carries a function_call, not a {role} message")
        if info.data.get("tool_calls"):
            raise ValueError("an assistant message carries its calls in tool_calls or in function_call, not both")
        return call

    @field_validator("audio")
    @classmethod
    def _no_audio_reply(cls, audio: dict) -> dict:
        """A reference to an audio reply of an earlier turn (OpenAI's ``{"id"}``): this server never
        made one to render (it was dropped: the turn rendered empty)."""
        raise coded("unsupported_value", "audio replies are not supported by this server: send the reply's text")

    @property
    def calls_field(self) -> str:
        return "function_call" if self.function_call is not None else "tool_calls"

    def calls(self) -> list[ToolCall]:
        """An assistant's calls: its tool_calls, or its function_call as one call whose id is the
        function's name (a function message answers it by that name, as OpenAI's deprecated
        functions protocol pairs them)."""
        if self.function_call is not None:
            return [ToolCall(id=self.function_call.name, function=self.function_call)]
        return self.tool_calls or []

    def answered_call(self) -> str | None:
        """The id of the call a result's message answers (a function message's: its name)."""
        return getattr(self, ANSWERING[self.role]) if self.role in ANSWERING else None

    def rendered_fields(self) -> dict:
        """The fields the turn renders besides its content, in OpenAI's current form: a function_call
        as tool_calls, a function message as the tool message answering it."""
        fields = self.model_dump(include={"reasoning_content", "name", "prefix"}, exclude_none=True)
        if calls := self.calls():
            fields["tool_calls"] = [call.model_dump() for call in calls]
        if (answered := self.answered_call()) is not None:
            fields["tool_call_id"] = answered
        return {**fields, "role": "tool" if self.role in ANSWERING else self.role}

    def rendered_parts(self) -> list[tuple[tuple[str | int, ...], str | Part]]:
        """The parts the turn renders, each with its field in the message: a string content is one
        part, ``("content",)``, a list's each ``("content", j)``; then the refusal, ``("refusal",)``, as a
        refusal part renders. OpenAI's SDK returns a refusal with content null, and a client sends it
        back so (it was ignored: an empty turn); with content too (OpenAI never sends both) it follows
        the content, as a refusal part follows a text part."""
        if isinstance(self.content, list):
            placed = [(("content", j), part) for j, part in enumerate(self.content)]
        elif self.content is not None or self.refusal is None:
            placed = [(("content",), self.content or "")]
        else:
            placed = []
        return placed + ([(("refusal",), self.refusal)] if self.refusal is not None else [])
