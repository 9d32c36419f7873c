"""/tokenize's and /detokenize's bodies and /tokenize's answer (vLLM's shapes)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field, model_validator

from .body_model import _Body, field_error
from .chat_schemas import MAX_MESSAGES, ChatPrompt
from .message_schemas import Message
from .schemas import MAX_TEXT


class TokenizeRequest(ChatPrompt):
    """vLLM's /tokenize: a chat (rendered as for chat completions) or a prompt text."""

    model: str = Field(max_length=256)
    prompt: str | None = Field(default=None, max_length=MAX_TEXT)
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    # vLLM's: the tokenizer's special tokens (BOS) added to the text; by default to a prompt (as
    # completions add them), not to a chat (its encoding writes its own BOS, kept either way)
    add_special_tokens: bool | None = None
    one_of: ClassVar[tuple[str, ...]] = ("messages", "prompt")  # (what an empty body is told: errors._no_body)

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise field_error(type(self), ("prompt",), "give either prompt or messages", self.prompt)
        if self.messages is not None and self.add_special_tokens:  # vLLM: a second BOS, no request's prompt
            why = "true is for a prompt: a chat's encoding writes its own special tokens"
            raise field_error(type(self), ("add_special_tokens",), why, self.add_special_tokens)
        return self


class Tokenized(BaseModel):
    """/tokenize's answer (a response model: written by pydantic's serializer; a plain dict went through
    FastAPI's jsonable_encoder, a Python walk of every id on the event loop: ~0.8 s for 1 M)."""

    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(_Body):
    model: str = Field(max_length=256)
    tokens: list[int] = Field(max_length=1 << 20)
