"""OpenAI-compatible request bodies, validated with limits on every field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    Strict,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from dayzero.params import MAX_BIAS, MAX_PENALTY, MIN_TEMPERATURE, SEED_RANGE

from .body_model import _Body, coded, field_error
from .unsupported import ENGINE_EXTENSIONS, UNSUPPORTED, VLLM_ONLY

MAX_STOP = 16  # stop strings per request (OpenAI takes 4)
MAX_TEXT = 1 << 20
MAX_CHOICES = 8  # n
MAX_PROMPTS = 32  # prompts in one completions request


def json_reply(body: Any) -> bool:
    """Whether a request (a completion's or a chat's) asks for a JSON reply: a grammar enforces it."""
    return body.response_format is not None and body.response_format.schema_() is not None


class JSONSchemaFormat(_Body):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's: required (it was optional here)
    description: str | None = Field(default=None, max_length=MAX_TEXT)
    json_schema: dict = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema")
        return self  # whether it can be enforced: chat.grammar, off the event loop (it compiles)

    def schema_(self) -> dict | None:
        """The JSON schema the reply must follow (None: free text)."""
        if self.type == "text":
            return None
        return self.json_schema.json_schema if self.json_schema is not None else {"type": "object"}


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (it was ignored: none but the last had any)

    @field_validator("continuous_usage_stats")
    @classmethod
    def _usage_at_the_end_only(cls, value: bool, info: ValidationInfo) -> bool:
        """Refused where it asks for something: vLLM repeats usage only in a stream that asks for it."""
        if value and info.data.get("include_usage"):
            raise coded("unsupported_value", f"continuous_usage_stats {VLLM_ONLY}; use include_usage")
        return value


# the first fields of a request (of equally deep errors one of theirs is named, as when they were
# checked on the raw body first); left out of the OpenAPI document (not OpenAI's)
_EngineExtensions = create_model(
    "_EngineExtensions", __base__=_Body, **{name: (SkipJsonSchema[Any], None) for name in ENGINE_EXTENSIONS}
)

_PROMPT_KINDS = {str: "text", list: "ids"}  # what each of several prompts may be
_PROMPT_NAMES = {"text": "a string", "ids": "a token-id list", "neither": "neither a string nor a token-id list"}

StopString = Annotated[str, Field(min_length=1, max_length=256)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]  # a prompt's, a message's content
# one of several prompts' token ids, bounded as one prompt's are (list_limits; pydantic stops at the
# bound): they were bounded by the body's size alone (8 MiB: 4 M one-digit ids)
TokenIds = Annotated[list[int], Field(max_length=MAX_TEXT)]


def _decimal_token_id(key: object) -> object:
    """A ``logit_bias`` key is a token id as OpenAI writes one: decimal digits, no sign, spaces or
    leading zeros. pydantic's lax int read "5.0", " 5", "+5" and "05" as token 5 ("5_0" as 50), and
    two spellings of one id ("5" and "05") as one key, the last bias winning unsaid."""
    if isinstance(key, str) and not (key.isascii() and key.isdigit() and (key == "0" or key[0] != "0")):
        raise ValueError(f"invalid key {key!r}: a token id is a non-negative integer in decimal, such as '5'")
    return key


TokenId = Annotated[int, Strict(False), BeforeValidator(_decimal_token_id)]


class Sampling(_EngineExtensions):
    model: str = Field(max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)  # 0 (greedy) or at least MIN_TEMPERATURE
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)  # 0: the most likely token alone (sampling)
    top_k: int = Field(default=0, ge=-1, le=1_000_000)  # 0 or -1 (vLLM's, SGLang's): every token
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])  # OpenAI's int64 (routes reduce it)
    stop: StopString | list[StopString] | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = Field(default=None, max_length=256)  # accepted and ignored
    logit_bias: dict[TokenId, Annotated[float, Field(ge=-MAX_BIAS, le=MAX_BIAS)]] | None = Field(
        default=None, max_length=300
    )
    presence_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    response_format: ResponseFormat | None = None  # json_object / json_schema: constrained decoding
    # OpenAI parameters this server does not implement: accepted at values that ask for nothing
    # more (their defaults), refused otherwise (a client asking for them must not get a silently
    # different answer); see _unsupported, and UNSUPPORTED for what each accepts
    functions: list[dict] | None = Field(default=None, max_length=128)
    function_call: str | dict | None = None
    modalities: list[str] | None = Field(default=None, max_length=8)
    audio: dict | None = None
    prediction: dict | None = None
    web_search_options: dict | None = None
    verbosity: str | None = Field(default=None, max_length=16)
    best_of: int | None = None
    suffix: str | None = Field(default=None, max_length=MAX_TEXT)

    @field_validator("temperature")
    @classmethod
    def _greedy_or_above_floor(cls, value: float) -> float:
        if 0.0 < value < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}")
        return value

    @field_validator("top_k")
    @classmethod
    def _all_tokens_is_0(cls, value: int) -> int:
        """-1 is vLLM's and SGLang's "every token" (their clients send it by default): 0 here."""
        return max(value, 0)

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP:  # each is matched at every token
            raise coded("too_long", f"at most {MAX_STOP} stop strings, not {len(value)}")
        return value

    @field_validator(*UNSUPPORTED)
    @classmethod
    def _unsupported(cls, value: object, info: ValidationInfo) -> object:
        accepted, why = UNSUPPORTED[info.field_name]
        if not accepted(value):  # null never gets here: it is the default
            raise coded("unsupported_value", f"{info.field_name} {why}")
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_with_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def usage_in_stream(self) -> bool:
        """A stream ends with a usage chunk (no choices) when ``stream_options.include_usage`` asks."""
        return self.stream_options is not None and self.stream_options.include_usage

    def logprob_count(self) -> int | None:
        """Alternatives per token to report (None: no logprobs); each endpoint spells it its way."""
        return None

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(stops)


class CompletionRequest(Sampling):
    list_limits = {"prompt": MAX_TEXT}  # its token ids (several prompts: MAX_PROMPTS)
    tools: list[dict] | None = Field(default=None, max_length=128)
    tool_choice: str | dict | None = None

    @field_validator("tools")
    @classmethod
    def _chat_only(cls, value: list[dict] | None) -> list[dict] | None:
        if value:
            raise coded("unsupported_parameter", "tools are a chat completions parameter")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: object) -> object:
        if value not in (None, "none"):
            raise coded("unsupported_parameter", "tool_choice is a chat completions parameter")
        return value

    prompt: Text | list[int] | list[Text] | list[TokenIds]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False  # the completion starts with the prompt (and, with logprobs, the prompt's logprobs)

    def logprob_count(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")  # before the prompts' items are validated
    @classmethod
    def _prompt_shape(cls, value: object) -> object:
        """At most MAX_PROMPTS prompts, of one kind: each a string, or each a token-id list (a mix was
        refused as the first union branch saw it: "prompt.0: Input should be a valid integer" for
        ``["text", [1]]``, whose prompt 0 is a string)."""
        if not isinstance(value, list) or not value or isinstance(value[0], int):
            return value  # one text, or one prompt of token ids (pydantic names a stray item in it)
        if len(value) > MAX_PROMPTS:
            raise coded("too_long", f"at most {MAX_PROMPTS} prompts in one request, not {len(value)}")
        kinds = [_PROMPT_KINDS.get(type(item), "neither") for item in value]
        if (odd := next((i for i, kind in enumerate(kinds) if kind != kinds[0]), None)) is not None:
            raise PydanticCustomError(
                "invalid_type",
                "prompt {odd} is {kind} and prompt 0 {first}: the prompts must all be strings or all token-id lists",
                {"odd": odd, "kind": _PROMPT_NAMES[kinds[odd]], "first": _PROMPT_NAMES[kinds[0]]},
            )
        return value

    @model_validator(mode="after")
    def _choice_count(self) -> CompletionRequest:
        if len(self.prompts()) * self.n > MAX_PROMPTS:
            raise field_error(type(self), ("n",), f"prompts x n must be at most {MAX_PROMPTS}", self.n)
        return self

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: one text or token list, or several."""
        if isinstance(self.prompt, str) or not self.prompt or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)
