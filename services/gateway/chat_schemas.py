"""Chat request bodies: messages, tools, tool choice, thinking mode (/tokenize takes the same chat:
tokenize_schemas)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationInfo, field_validator, model_validator

from dayzero.chat.auto_grammar import strict_tools
from dayzero.chat.call_parameters import parameters_problem
from dayzero.chat.schema_size import MOST_TOOLS

from .body_model import _Body, coded, field_error
from .message_schemas import Message
from .schemas import MAX_TEXT, ResponseFormat, Sampling, json_reply
from .thinking_mode import ChatTemplateKwargs, Effort, ThinkingSwitch, thinking_conflict, v4_effort
from .tool_results import unanswered_result

MAX_MESSAGES = 256
# content parts and tool calls of all messages together: each is a model validated on the event loop
# before anything else runs (256 messages of 1,024 parts, 7.9 MB, stalled every stream ~2 s)
MAX_REQUEST_PARTS = 4096
# OpenAI's newer forms of a tool and a tool choice, by their type: none is served here (its calls are
# functions', all its tools callable); each was told invalid_value ("Input should be 'function'")
CUSTOM_TOOLS = "(a custom tool: free-form input) is not supported by this server: its tools are functions"
UNSUPPORTED_CHOICES = {
    "custom": CUSTOM_TOOLS,
    "allowed_tools": (
        '(a subset of the tools callable) is not supported by this server: send those tools alone, tool_choice "auto"'
        ' or "required"'
    ),
}


class Function(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = Field(default=None, max_length=MAX_TEXT)
    parameters: dict | None = None  # a JSON schema
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _names_fit_the_call_format(cls, schema: dict | None) -> dict | None:
        """V4 writes each argument as ``parameter name="KEY"`` with no escape: a KEY holding a quote
        would come back cut, its value lost; one holding a ``<`` the reply parser does not read (as
        in a history call's argument names)."""
        properties = (schema or {}).get("properties")
        for key in properties if isinstance(properties, dict) else ():
            if mark := next((m for m in ('"', "<") if m in key), None):
                raise ValueError(f"parameter name {key!r}: the model's tool calls cannot carry a {mark!r} in a name")
        return schema


class Tool(_Body):
    type: Literal["function"]
    function: Function


_TOOLS = TypeAdapter(list[Tool])


class NamedFunction(_Body):
    name: str = Field(max_length=64)


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatPrompt(_Body):
    """What a chat's prompt is made of."""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    # kept as sent: rendered into the prompt (at most DAYZERO_MAX_TOOLS: the gateway's check_tool_set)
    tools: list[dict] | None = Field(default=None, max_length=MOST_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: Effort | None = None
    switch: ThinkingSwitch | None = Field(default=None, alias="thinking")  # (thinking() is the mode)
    response_format: ResponseFormat | None = None  # json_object / json_schema: a section of the system prompt

    @field_validator("messages", mode="before")
    @classmethod
    def _few_parts_in_all(cls, value: object) -> object:
        """Counted before any message is validated; not past MAX_MESSAGES, which the list's own bound
        refuses next, at once (2 M empty messages in 8 MiB were counted for ~0.5 s first)."""
        if isinstance(value, list) and len(value) <= MAX_MESSAGES:
            fields = [m.get(name) for m in value if isinstance(m, dict) for name in ("content", "tool_calls")]
            if (parts := sum(len(f) for f in fields if isinstance(f, list))) > MAX_REQUEST_PARTS:
                raise coded(
                    "too_long", f"at most {MAX_REQUEST_PARTS} content parts and tool calls in all messages, not {parts}"
                )
        return value

    @field_validator("messages")
    @classmethod
    def _prefix_ends_the_chat(cls, messages: list[Message] | None) -> list[Message] | None:
        """Refused naming the message's prefix (it named "messages", the index in pydantic's dotted
        words: "messages: 0.prefix: ...")."""
        for i, m in enumerate(messages or []):
            if not m.prefix:
                continue
            if m.role != "assistant" or i != len(messages) - 1:
                why = "only the last message, an assistant's, can be a prefix"
            elif m.calls():
                why = f"a prefix holds text, not {m.calls_field}"
            else:
                continue
            raise field_error(cls, ("messages", i, "prefix"), why, True)
        return messages

    @field_validator("messages")
    @classmethod
    def _tool_results_answer_calls(cls, messages: list[Message] | None) -> list[Message] | None:
        if unanswered := unanswered_result(messages or []):
            where, message = unanswered
            raise field_error(cls, where, message, messages[where[0]].model_dump()[where[1]])
        return messages

    def ends_with_prefix(self) -> bool:
        return bool(self.messages and self.messages[-1].prefix)

    @field_validator("tools")
    @classmethod
    def _tool_definitions(cls, value: list[dict] | None) -> list[dict] | None:
        # a tool's own error keeps its place and kind (param tools[0].function.name, a code)
        customs = [i for i, tool in enumerate(value or []) if isinstance(tool, dict) and tool.get("type") == "custom"]
        if customs:
            _TOOLS.validate_python(value[: customs[0]])  # a tool before it told its own error first
            raise field_error(cls, (customs[0], "type"), f"type 'custom' {CUSTOM_TOOLS}", "custom", "unsupported_value")
        names = [t.function.name for t in _TOOLS.validate_python(value or [])]
        if len(set(names)) < len(names):
            raise ValueError("tool names must be unique")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _choice_of_a_form_served(cls, choice: object) -> object:
        form = choice.get("type") if isinstance(choice, dict) else None
        if isinstance(form, str) and form in UNSUPPORTED_CHOICES:
            raise field_error(cls, ("type",), f"type {form!r} {UNSUPPORTED_CHOICES[form]}", form, "unsupported_value")
        return choice

    @field_validator("tool_choice")
    @classmethod
    def _choice_names_a_tool(cls, choice: object, info: ValidationInfo) -> object:
        names = [t["function"]["name"] for t in info.data.get("tools") or []]
        if choice not in (None, "none", "auto") and not names:
            raise ValueError("tool_choice other than none or auto needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among the tools")
        return choice

    @model_validator(mode="after")
    def _enforced_tools_are_enforceable(self) -> ChatPrompt:
        """The parameters of each tool a grammar enforces need a form its call can keep (under
        tool_choice auto the model only reads them: any schema goes). Whether llguidance can
        enforce them is chat.grammar's check, off the event loop: it compiles (seconds for some)."""
        for i, name, parameters in self.enforced_parameters():
            if problem := parameters_problem(parameters):
                message = f"cannot enforce the parameters of tool {name!r}: {problem}"
                where = ("tools", i, "function", "parameters")  # the tool's own field, not the whole model
                raise field_error(type(self), where, message, parameters)
        return self

    @model_validator(mode="after")
    def _prefix_is_not_constrained(self) -> ChatPrompt:
        if self.ends_with_prefix() and self.constrained():
            message = "a prefix cannot be continued under tool_choice required / named, a strict tool, response_format"
            raise field_error(type(self), ("messages", len(self.messages) - 1, "prefix"), message, True)
        return self

    def constrained(self) -> bool:
        """Whether a grammar has anything to enforce: a call (a strict tool's under "auto" too), or a JSON reply."""
        return bool(self.enforced_tools()) or json_reply(self)

    def enforced_tools(self) -> list[dict]:
        """The tools whose calls a grammar enforces: all under tool_choice required, the named one,
        the ``strict`` ones under auto (none beside a JSON reply: its grammar applies, no call's)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return [t for t in self.tools or [] if t["function"]["name"] == self.tool_choice.function.name]
        if self.tool_choice in (None, "auto"):
            return [] if json_reply(self) else strict_tools(self.tools or [])
        return list(self.tools or []) if self.tool_choice == "required" else []

    def enforced_parameters(self) -> list[tuple[int, str, dict]]:
        """(index among the tools, name, parameters schema) of each tool whose calls a grammar enforces."""
        enforced = {t["function"]["name"] for t in self.enforced_tools()}
        return [
            (i, t["function"]["name"], t["function"].get("parameters") or {})
            for i, t in enumerate(self.tools or [])
            if t["function"]["name"] in enforced
        ]

    @model_validator(mode="after")
    def _one_thinking_mode(self) -> ChatPrompt:
        if conflict := thinking_conflict(
            self.chat_template_kwargs or ChatTemplateKwargs(), self.switch, self.reasoning_effort
        ):
            raise field_error(type(self), *conflict)
        return self

    def thinking(self) -> tuple[bool, str]:
        """Thinking mode and its effort (low | high | max): from chat_template_kwargs (vLLM's
        convention) or DeepSeek's ``thinking`` switch, else from OpenAI's reasoning_effort; chat
        mode by default."""
        kwargs = self.chat_template_kwargs or ChatTemplateKwargs()
        effort = self.reasoning_effort
        thinking = kwargs.thinking
        if thinking is None:
            thinking = self.switch.type == "enabled" if self.switch else effort not in (None, "none")
        return thinking, kwargs.reasoning_effort or v4_effort(effort)

    def offered_tools(self) -> list[dict]:
        """The tools the model is told about (none with tool_choice "none")."""
        return [] if self.tool_choice == "none" else list(self.tools or [])


MetadataKey, MetadataValue = Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]


class ChatCompletionRequest(Sampling, ChatPrompt):
    max_completion_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=16)  # OpenAI's; ignored
    store: bool | None = None  # OpenAI's (stored completions, metadata's use): ignored, as vLLM does; typed
    # OpenAI's too, ignored and typed as its schema types them (as undeclared keys any value was taken)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    parallel_tool_calls: bool | None = None  # false: held to one call (tool_choice required / named)

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise coded("unsupported_parameter", "echo is a completions parameter; chat completions do not echo")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs: true")
        return value

    @model_validator(mode="after")
    def _one_call_can_be_held(self) -> ChatCompletionRequest:
        """One call at most: a grammar holds tool_choice required to one, a named one is one, none
        and no tools call nothing, a strict tool's grammar holds auto to one; else under auto nothing
        stops the model writing several."""
        free = self.tool_choice in (None, "auto") and not self.enforced_tools()
        if self.parallel_tool_calls is False and self.offered_tools() and free:
            message = "false needs tool_choice required, a named function or a strict tool: "
            message += "under auto a reply may call several tools"
            raise field_error(type(self), ("parallel_tool_calls",), f"parallel_tool_calls {message}", False)
        return self

    def logprob_count(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None
