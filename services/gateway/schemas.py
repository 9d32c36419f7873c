"""OpenAI-compatible request bodies, validated with limits on every field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator

MAX_STOP = 4
MAX_MESSAGES = 256
MAX_TEXT = 1 << 20
MAX_CHOICES = 8  # n
MAX_PROMPTS = 32  # prompts in one completions request


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # "max_tokens": "4" is refused, not coerced


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
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    logit_bias: dict[Annotated[int, Strict(False)], Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        default=None, max_length=300
    )
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    # OpenAI parameters this server does not implement: accepted at their defaults, refused
    # otherwise (a client asking for them must not get a silently different answer)
    tools: list[dict] | None = Field(default=None, max_length=128)
    tool_choice: str | dict | None = None
    functions: list[dict] | None = Field(default=None, max_length=128)
    response_format: dict | None = None
    best_of: int | None = None
    suffix: str | None = Field(default=None, max_length=MAX_TEXT)

    @field_validator("tools", "functions", "suffix")
    @classmethod
    def _unsupported(cls, value: object, info: ValidationInfo) -> object:
        if value:
            raise ValueError(f"{info.field_name} is not supported by this server")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: object) -> object:
        if value not in (None, "none"):
            raise ValueError("tool calling is not supported by this server")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict | None) -> dict | None:
        if value and value.get("type", "text") != "text":
            raise ValueError("only response_format {'type': 'text'} is supported by this server")
        return value

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("best_of must be 1 on this server")
        return value

    def usage_in_stream(self) -> bool:
        """Streams end with usage unless ``stream_options.include_usage`` is false."""
        return self.stream_options is None or self.stream_options.include_usage

    def logprob_count(self) -> int | None:
        """Alternatives per token to report (None: no logprobs); each endpoint spells it its way."""
        return None

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(stops)


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is a completions parameter; chat completions do not echo")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs: true")
        return value

    def logprob_count(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[Annotated[str, Field(max_length=MAX_TEXT)]] | list[list[int]] = Field(
        max_length=MAX_TEXT
    )
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False  # the completion starts with the prompt (and, with logprobs, the prompt's logprobs)

    def logprob_count(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompt_count(cls, value: str | list) -> str | list:
        if isinstance(value, list) and value and not isinstance(value[0], int) and len(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts in one request")
        return value

    @model_validator(mode="after")
    def _choice_count(self) -> CompletionRequest:
        if len(self.prompts()) * self.n > MAX_PROMPTS:
            raise ValueError(f"prompts x n must be at most {MAX_PROMPTS}")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: one text or token list, or several."""
        if isinstance(self.prompt, str) or not self.prompt or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)
