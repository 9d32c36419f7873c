"""OpenAI-compatible request bodies, validated with limits on every field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP = 4
MAX_MESSAGES = 256
MAX_TEXT = 1 << 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ImageURL(_Body):
    url: str = Field(max_length=16 << 20)
    detail: str | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(_Body):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[Part] = Field(max_length=MAX_TEXT)


class StreamOptions(_Body):
    include_usage: bool = True


class Sampling(_Body):
    model: str = Field(max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=1_000_000)
    seed: int | None = Field(default=None, ge=0, le=2**62)
    stop: str | list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(default=None)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    logit_bias: dict[int, Annotated[float, Field(ge=-100, le=100)]] | None = Field(default=None, max_length=300)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(stops)


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(Sampling):
    prompt: str | list[int] = Field(max_length=MAX_TEXT)
