"""A chat request -> prompt ids and the grammar its answer must follow (DeepSeek-V4's protocol:
dayzero.chat)."""

from __future__ import annotations

import anyio.to_thread
from starlette.concurrency import run_in_threadpool

from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.call_parameters import value_definitions
from dayzero.chat.dsml import render_calls, to_json
from dayzero.chat.encoding import ChatOptions
from dayzero.chat.grammar import (
    Unenforceable,
    dsml_symbol,
    grammar_problem,
    json_grammar,
    tool_calls_grammar,
)
from dayzero.chat.schema_literals import spelled_token
from dayzero.chat.schema_size import more_nodes_than, size_problem
from dayzero.chat.schema_walks import tool_probe_steps, walked_schemas
from dayzero.chat.tokens import DSML, END_THINK, THINK
from dayzero.params import Grammar, is_unicode
from dayzero.tokenizer import ChatTemplateError

from .chat_schemas import ChatPrompt, NamedToolChoice
from .context import ENCODED_ON_THE_LOOP, TOKENIZED_APART, Gateway, tokenizing, tokenizing_threads
from .error_fields import INVALID_UNICODE, param_path
from .errors import APIError
from .images import IMAGE_TAG, Prompt, expand_placeholders, render_chat
from .message_schemas import part_text
from .schemas import Sampling, json_reply


def chat_prompt(gw: Gateway, body: ChatPrompt) -> tuple[list[int], Prompt]:
    """The chat's prompt ids (each image expanded to its patches) and its rendered messages."""
    s = gw.settings
    prompt = render_chat(body.messages, s.image_limits(), s.patch_spec(gw.vision_config), gw.image_token is not None)
    thinking, effort = body.thinking()
    schema = body.response_format.schema_() if body.response_format else None
    options = ChatOptions(thinking, effort, tuple(body.offered_tools()), schema)
    try:
        with tokenizing("messages"):  # a chat far over the context is refused from its size, untokenized
            ids = gw.codec.chat_ids(prompt.messages, options, gw.context_limit)
    except ChatTemplateError as refused:  # (a Jinja template's: it was a 500)
        raise APIError(400, str(refused), param="messages", code="invalid_value") from None
    except APIError as refused:
        if refused.code != INVALID_UNICODE:  # (the context's)
            raise
        where = _field_holding_a_lone_surrogate(body)  # the text's: looked for only now
        raise APIError(400, f"{where}: {refused.message}", param=where, code=refused.code) from None
    if gw.image_token is not None:  # every placeholder must be an attached image's, none typed in text
        try:
            ids = expand_placeholders(ids, gw.image_token, prompt.patches, "messages")
        except APIError as refused:  # the field the tag was typed into, looked for only now
            raise APIError(400, refused.message, param=_field_holding_the_tag(options), code=refused.code) from None
    return ids, prompt


async def prompted(gw: Gateway, body: ChatPrompt) -> tuple[list[int], Prompt]:
    """``chat_prompt``, off the event loop (images decode there, long text tokenizes there), a long
    chat on ``gw.tokenizing``'s threads as a completion's long prompt (``context.encoded``), unless
    the chat is short text alone: rendered and tokenized on the loop, as a completion's short prompt
    is, for less than the thread pool's hop and back."""
    if _short_text(body):
        return chat_prompt(gw, body)
    return await anyio.to_thread.run_sync(chat_prompt, gw, body, limiter=tokenizing_threads(gw, _long(body)))


# A chat of more content parts and calls than this is long (``_long``) whatever its text: counting
# its text on the loop stops there (4,096 empty parts took 1.1 ms to count in all)
LONG_PARTS = 64


def _long(body: ChatPrompt) -> bool:
    """Over ``TOKENIZED_APART`` characters of text (content, reasoning, calls' arguments) or
    ``LONG_PARTS`` parts and calls, or with an image, tools or a reply schema: work its text does not
    measure (decoding, rendering)."""
    if body.tools or (body.response_format and body.response_format.schema_() is not None):
        return True
    size = count = 0
    for message in body.messages:
        texts = [part_text(part) for _, part in message.rendered_parts()]
        if None in texts:  # an image
            return True
        calls = message.calls()
        count += len(texts) + len(calls)
        size += sum(map(len, texts)) + len(message.reasoning_content or "")
        size += sum(len(call.function.arguments) for call in calls)
        if size > TOKENIZED_APART or count > LONG_PARTS:
            return True
    return False


UNENFORCEABLE = "unsupported_schema"  # a schema (response_format, a tool's) no grammar here enforces

# A short chat's messages and content parts in all (a message's string content: one part): each
# costs its rendering whatever its text (~3 us a message, ~0.4 us a part: 256 empty messages, or 4,096
# empty parts, took 0.8 and 1.6 ms on the loop, text of 0 characters)
RENDERED_ON_THE_LOOP = 8


def _short_text(body: ChatPrompt) -> bool:
    """No tools, no reply schema, no image, no call in the history, at most ``RENDERED_ON_THE_LOOP``
    messages' content parts, and the messages' text (their content and reasoning) within
    ``ENCODED_ON_THE_LOOP`` characters."""
    if body.tools or (body.response_format and body.response_format.schema_() is not None):
        return False
    size = count = 0
    for message in body.messages:
        parts = message.rendered_parts()
        count += len(parts)
        if count > RENDERED_ON_THE_LOOP or message.calls():
            return False
        texts = [part_text(part) for _, part in parts]
        if None in texts:  # an image
            return False
        size += sum(len(text) for text in texts)
        size += len(message.reasoning_content or "")
    return size <= ENCODED_ON_THE_LOOP


def _field_holding_the_tag(options: ChatOptions) -> str:
    """The field to blame for a placeholder no image put there: tool or schema text, else the
    messages' (their content refuses it itself; reasoning and call arguments do not)."""
    for field, value in (("tools", options.tools), ("response_format", options.response_format)):
        if IMAGE_TAG in to_json(value):
            return field
    return "messages"


def _field_holding_a_lone_surrogate(body: ChatPrompt) -> str:
    """The first rendered field whose text is not Unicode (``messages[0].content``; for a key, the
    object it is in: ``tools[0].function.parameters.properties``): the tokenizer refused the prompt."""
    rendered = body.model_dump(include={"messages", "tools", "response_format"}, by_alias=True, exclude_none=True)
    walk: list[tuple[object, tuple]] = [(rendered, ())]
    while walk:
        value, where = walk.pop()
        if where and not is_unicode(str(where[-1])):  # (the param names no surrogate: it could not be sent)
            return param_path(where[:-1])
        if isinstance(value, str) and not is_unicode(_as_rendered(value, where)):
            return param_path(where)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        walk += [(item, (*where, key)) for key, item in reversed(list(items))]
    return "messages"


def _as_rendered(text: str, where: tuple) -> str:
    """A field's text as the prompt holds it: a past call's arguments as its block renders them (an
    object's values decoded from JSON: their ``"\\ud800"``, plain ASCII as sent, is a lone surrogate
    there; the field was never named. Other JSON is rendered as sent: ``["\\ud800"]`` is ASCII)."""
    legacy = where[-2:] == ("function_call", "arguments")  # (an assistant's deprecated call)
    if not legacy and ("tool_calls" not in where or where[-2:] != ("function", "arguments")):
        return text
    return render_calls([{"function": {"name": "", "arguments": text}}])


def _enforced_tools(body: Sampling) -> list[dict]:
    return body.enforced_tools() if isinstance(body, ChatPrompt) else []  # (a completion calls no tool)


def constrained(body: Sampling) -> bool:
    """Whether ``grammar`` has anything to enforce: a call (a strict tool's under "auto" too), or a
    JSON reply. Without, a request takes no hop to the thread pool (where a grammar compiles) on its
    way to the queue."""
    return body.constrained() if isinstance(body, ChatPrompt) else json_reply(body)


async def enforced(gw: Gateway, body: Sampling, thinking: bool = False) -> Grammar | None:
    """``grammar``, checked and compiled off the event loop (llguidance: seconds for some schemas);
    none asked for, no thread hop (~0.1 ms of CPU, 0.2 ms of the admission on an idle stack, more
    under load: the pool's thread and then the loop wait for a core)."""
    return await run_in_threadpool(grammar, gw, body, thinking) if constrained(body) else None


def grammar(gw: Gateway, body: Sampling, thinking: bool = False) -> Grammar | None:
    """What constrained decoding enforces: a call (tool_choice required or named), else a JSON
    reply (response_format json_object / json_schema), in thinking mode only after ``</think>``;
    else, under "auto" with a ``strict`` tool, each call block the reply writes (auto_grammar)."""
    choice = getattr(body, "tool_choice", None)
    schema = body.response_format.schema_() if body.response_format else None
    calls = _enforced_tools(body)
    auto_strict = bool(calls) and choice in (None, "auto")  # (a strict tool's calls, enforced under auto)
    if calls:
        named = choice.function.name if isinstance(choice, NamedToolChoice) else None
        names = tuple(t["function"]["name"] for t in (body.tools or [] if auto_strict else calls))  # (spelled)
        _check_size(gw, _enforced_schemas(body), "tools", names)
        _check_tools(body)
        try:
            dsml, parallel = dsml_symbol(gw.codec.token_id(DSML), DSML), body.parallel_tool_calls is not False
            lark = (
                auto_calls_grammar(body.tools, dsml, _kept_tokens(gw, thinking), parallel)
                if auto_strict
                else tool_calls_grammar(body.tools, dsml, named, parallel)
            )
            param = "tools"
        except Unenforceable as exc:
            raise APIError(400, f"cannot enforce this schema: {exc}", param="tools", code=UNENFORCEABLE) from None
    elif schema is not None:
        _check_size(gw, [schema], "response_format")
        if problem := walked_schemas().problem(schema):
            raise APIError(400, f"cannot enforce this schema: {problem}", param="response_format", code=UNENFORCEABLE)
        lark, param = json_grammar(schema), "response_format"
    else:
        return None
    enforced = [p for _, _, p in body.enforced_parameters()] if param == "tools" else [schema]
    if gw.codec.has_tokenizer and (token := spelled_token(enforced, gw.codec.special_texts)):
        message = f"cannot enforce this schema: it spells the special token {token}, which a reply cannot write as text"
        raise APIError(400, message, param=param, code=UNENFORCEABLE)
    after = None  # (under "auto" the grammar holds the thought too: its text is free, a block is not)
    if thinking and not auto_strict and (after := gw.codec.token_id(END_THINK)) is None:
        message = f"thinking mode with a constrained answer needs {END_THINK} as one token"
        raise APIError(400, message, param=param, code=UNENFORCEABLE)
    if problem := grammar_problem(lark, gw.codec.grammars):
        raise APIError(400, f"cannot enforce this schema: {problem}", param=param, code=UNENFORCEABLE)
    return Grammar(lark, after, param)


def _kept_tokens(gw: Gateway, thinking: bool) -> tuple[str, ...]:
    """The special tokens free text under "auto" may hold: in thinking mode the thought's marks (the
    grammar holds the thought too; the marker opens a block). In chat mode none: the answer drops
    them (chat.output), and the text on either side would join."""
    marks = (THINK, END_THINK) if thinking else ()
    return tuple(f"<[{i}]>" for t in marks if (i := gw.codec.token_id(t)) is not None)


def check_tool_set(gw: Gateway, body: ChatPrompt) -> None:
    """The tools a chat offers, bounded under any tool_choice before a grammar compiles or the
    prompt is rendered (8,000 properties took 130-450 ms to render before the prompt's length
    refused them): at most DAYZERO_MAX_TOOLS tools, and the tools the model is shown no more
    subschemas than the context has tokens (each renders to one at least: a set past it could never
    fit). The enforced ones' compile limits are the grammar's check (``grammar``), also before it."""
    tools, most = body.tools or [], gw.settings.max_tools
    if len(tools) > most:
        raise APIError(
            400,
            f"{len(tools)} tools: at most DAYZERO_MAX_TOOLS={most} can be offered",
            param="tools",
            code="array_above_max_length",
        )
    if more_nodes_than(_parameters(body.offered_tools()), limit := gw.context_limit):
        message = f"the tools are too big: more than {limit:,} subschemas, each at least one token of the prompt, "
        raise APIError(400, message + f"whose context holds {limit:,}", param="tools", code="context_length_exceeded")


def _parameters(tools: list[dict]) -> list[dict]:
    return [t["function"].get("parameters") or {} for t in tools]


def _enforced_schemas(body: ChatPrompt) -> list[dict]:
    """What a forced call's grammar compiles: each enforced tool's parameters, and each property's
    own copy of the definitions its value needs (``value_definitions``: 10 properties referring to
    a definition compile it 10 times)."""
    schemas = []
    for _, _, parameters in body.enforced_parameters():
        properties = parameters.get("properties")
        copies = (value_definitions(p, parameters) for p in properties.values()) if isinstance(properties, dict) else ()
        schemas.extend([parameters, *filter(None, copies)])
    return schemas


def _check_size(gw: Gateway, schemas: list, param: str, calls: tuple[str, ...] = ()) -> None:
    """The schemas one grammar would enforce, measured before anything compiles them: past a limit,
    400 in milliseconds (llguidance's compile of 8,000 properties took seconds of CPU, then refused).
    ``calls``: the names of the tools whose calls the grammar writes (under "auto", every tool's)."""
    if problem := size_problem(schemas, gw.settings.schema_limits(), calls):
        raise APIError(400, f"cannot enforce this schema: too big: {problem}", param=param, code=UNENFORCEABLE)


def _check_tools(body: ChatPrompt) -> None:
    """Each enforced tool's parameters, as a JSON schema, one llguidance can enforce (400 naming
    the tool's field)."""
    enforced = body.enforced_parameters()
    for i, name, parameters in enforced:
        if problem := walked_schemas().problem(parameters, tool_probe_steps(len(enforced))):
            where = param_path(("tools", i, "function", "parameters"))
            message = f"{where}: cannot enforce the parameters of tool {name!r}: {problem}"
            raise APIError(400, message, param=where, code=UNENFORCEABLE)
