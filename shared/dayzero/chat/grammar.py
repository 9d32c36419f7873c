"""Lark grammars (llguidance's dialect) for constrained decoding: a JSON reply, or DSML tool calls
whose arguments follow each tool's JSON schema; and why llguidance cannot enforce one (the
gateway refuses such a request with 400 before it queues).

``dsml`` is how the grammar names the DSML marker: ``<[ID]>`` when the tokenizer has it as one
token (the model then has to emit that token, as it was trained), else the text itself.
JSON is compact in the style of ``json.dumps`` (", " and ": ", no other whitespace), so even a
weak model cannot wander off into endless whitespace.
"""

from __future__ import annotations

import functools
import re

from .call_parameters import parameters_problem, value_definitions
from .dsml import to_json
from .schema_bounds import bound_problem
from .schema_discriminator import without_discriminators
from .schema_endless import endless_problem
from .schema_openapi import as_llguidance, grammar_cap
from .schema_rows import ROW_ITEMS

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# llguidance's errors: "at LINE(COL): what\n   LINE | the grammar's line\n   ^" (the grammar is ours)
_LOCATED = re.compile(r"at \d+\(\d+\): (?:failed to compile JSON schema: )?(.*?)\n\s*\d+ \| ", re.DOTALL)


def dsml_symbol(token_id: int | None, text: str) -> str:
    return f"<[{token_id}]>" if token_id is not None else _literal(text)


def _literal(text: str) -> str:
    """A Lark string literal (its escapes are JSON's)."""
    return to_json(text)


def _json_rule(schema: dict) -> str:
    return "%json " + to_json({**as_llguidance(without_discriminators(schema)), "x-guidance": JSON_STYLE})


def json_grammar(schema: dict | None) -> str:
    """A JSON value following ``schema`` (None: any JSON object)."""
    return "start: " + _json_rule(schema if schema is not None else {"type": "object"}) + "\n"


PROBE_STEPS = 8  # tokens the check walks: a grammar failing there would fail every reply there
# bytes a JSON schema's check walks (a byte each: cheap): past a few properties, to a required one's
# value (a pattern past llguidance's lexer, a $ref to its own object: each failed every reply there;
# 64 bytes let one ~170 bytes in through): ~0.8 ms a walk (64: ~0.2; 1,024: ~30, bench/schema_walk.py)
SCHEMA_PROBE_STEPS = 256


def schema_problem(schema: dict, steps: int = SCHEMA_PROBE_STEPS) -> str | None:
    """Why constrained decoding cannot enforce the JSON schema ``schema`` (None: it can), walked
    ``steps`` bytes, or with no finite value (``endless_problem``: failing wherever a reply reaches it),
    or a pattern the walk never reaches failing where it stands (``unreached_problem``)."""
    walk = {"steps": steps, "first": ord('"')}  # (the byte vocabulary's quote: a string ends soon)
    walked = bound_problem(schema) or grammar_problem(json_grammar(schema), _byte_grammars(), **walk)
    walked = walked or endless_problem(schema)  # (what it found past the bytes walked)
    from .schema_unreached import unreached_problem  # (it walks this module's grammars)

    return walked or unreached_problem(schema)


@functools.cache
def parser_limits():
    """What llguidance may spend building a grammar's lexer: a fifth of its defaults (a pattern such
    as ``^((a{1000}){1000}){100}$`` took ~1-3 s of CPU before failing at its first token, on the
    gateway's event loop and again in a worker; 0.07 s under these, bench/guided.py), and still
    several times what schemas in use take (2000-value enums, 128 tools: the bench's table). A row of
    its parser holds ``ROW_ITEMS`` (its default, named: schema_rows refuses an object past it)."""
    import llguidance

    fuel = {"initial_lexer_fuel": 200_000, "step_lexer_fuel": 100_000}
    return llguidance.LLParserLimits(**fuel, max_lexer_states=50_000, max_items_in_row=ROW_ITEMS)


def grammar_problem(lark: str, grammars, steps: int = PROBE_STEPS, first: int | None = None) -> str | None:
    """Why llguidance cannot enforce ``lark`` over the tokenizer of ``grammars`` (a
    ``grammars.Grammars``: compiled once per process), in short (None: it can): it does not
    compile, nothing at all satisfies it (its first step fails), or it fails within its first
    ``steps`` (past a limit of the parser, or a required property whose $ref is its own object),
    walked by the lowest token each allows (``first`` whenever it is allowed)."""
    try:
        lark.encode()
    except UnicodeEncodeError as exc:  # (llguidance's error quoted the whole grammar, ours)
        return f"a string holds a lone surrogate (\\u{ord(lark[exc.start]):04x}): not Unicode, it cannot be enforced"
    matcher, tokenizer = grammars.matcher(lark), grammars.tokenizer
    if matcher.is_error():
        return error_summary(matcher.get_error())
    for step in range(steps):
        mask = matcher.compute_logit_bias()  # [V] bytes, 200: allowed
        if matcher.is_error():
            return _walk_failed(matcher.get_error(), first_step=step == 0)
        token = first if first is not None and mask[first] == 200 else next(_allowed(mask, tokenizer.eos_token), None)
        if token is None:  # complete: only the end is left
            return None
        matcher.consume_token(token)  # (a lexer past its limits fails here: on a token its mask allowed)
    return _walk_failed(matcher.get_error(), first_step=False) if matcher.is_error() else None


def _walk_failed(error: str, first_step: bool) -> str:
    """Why a walk failed: the lexer past its limits (at the first step too, once an earlier walk of
    the grammar built the states they share: it was told NOTHING), nothing allowed at the first step,
    or llguidance's why."""
    if error.startswith(LEXER_ERROR):
        return UNWRITABLE.format(error_summary(error))
    return NOTHING if first_step else error_summary(error)


def _allowed(mask: bytes, end: int):
    """The tokens ``mask`` allows but ``end``, lowest first."""
    start = 0
    while (token := mask.find(200, start)) >= 0:
        if token != end:
            yield token
        start = token + 1


def error_summary(error: str) -> str:
    """What llguidance found wrong, without the grammar text it quotes (ours, not the client's), and
    in the client's terms where it names an option of its own."""
    located = _LOCATED.match(error)
    summary = (located[1] if located else error.splitlines()[0]).strip()
    return next((ours for theirs, ours in _OURS.items() if theirs in summary), summary)


NOTHING = "nothing satisfies it (such as a $ref that only refers to itself)"
# a pattern such as ^(ab)*(ab){1000}$, satisfiable, past what the lexer may build (parser_limits)
UNWRITABLE = (
    "values may satisfy it, but the grammar engine cannot write one: its lexer is past its limits ({}); "
    "simplify its patterns or repeats"
)
LEXER_ERROR = "lexer error"


# llguidance's words the client cannot act on (an option of its API), in theirs
_OURS = {
    "Enable 'coerce_one_of'": "a oneOf whose branches a value could match more than one of cannot be enforced "
    "(write anyOf, or tell the branches apart: each an object requiring a property of its own const)",
}


class _ByteVocabulary:
    """The 256 single bytes and an end token: checks a grammar without a model's vocabulary
    (whether it compiles, whether anything satisfies it, are the same over any vocabulary)."""

    tokens = [bytes([b]) for b in range(256)] + [b"</s>"]
    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@functools.cache
def _byte_tokenizer():
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary()))


@functools.cache
def _byte_grammars():
    from ..grammars import Grammars

    return Grammars(_byte_tokenizer())


_CALLS_START = 'start: "\\n\\n<" '  # a forced call's grammar: the reply opens with the block


def holds_calls_only(lark: str) -> bool:
    """Whether ``lark`` is tool_calls_grammar's (tool_choice required or named): the reply holds only calls."""
    return lark.startswith(_CALLS_START)


def tool_calls_grammar(tools: list[dict], dsml: str, one: str | None = None, parallel: bool = True) -> str:
    """A DSML block of calls to ``tools`` (OpenAI tool dicts): exactly one call to the function
    named ``one``, or one or more calls to any of them (one: not ``parallel``)."""
    functions = [t["function"] for t in tools if one is None or t["function"]["name"] == one]
    lines = [  # the newline before the close is a lexeme of its own, as between calls (as part of
        # "\\n</" it was the lexer's choice after a call's newline, and a second call's "<" refused)
        f'{_CALLS_START}{dsml} "tool_calls>\\n" calls "\\n" "</" {dsml} "tool_calls>"',
        "calls: call" if one is not None or not parallel else 'calls: call ("\\n" call)*',
        "call: " + " | ".join(f"invoke_{i}" for i in range(len(functions))),
    ]
    cap = grammar_cap(f.get("parameters") or {} for f in functions)
    lines.extend(rule for i, function in enumerate(functions) for rule in invoke_rules(i, function, dsml, cap))
    return "\n".join(lines) + "\n"


def invoke_rules(i: int, function: dict, dsml: str, cap: int | None) -> list[str]:
    """``invoke_i``: the call's tag, then each parameter on its own line (declared order; the
    optional ones may be left out). ``cap``: the maxLength cap of every enforced tool's parameters
    together (``grammar_cap``: one lexer's)."""
    schema = as_llguidance(function.get("parameters") or {}, cap)
    if problem := parameters_problem(schema):
        raise Unenforceable(problem)
    props, required = schema.get("properties") or {}, set(schema.get("required") or ())
    head = _literal(f'invoke name="{function["name"]}">\n')
    body, rules = [], []
    for j, (key, prop) in enumerate(props.items()):
        if prop is False:  # a boolean schema: nothing may go here (schema_problem refuses it when required)
            continue
        if not isinstance(prop, dict):  # ``true``: any JSON value
            prop = {}
        if "const" in prop and "enum" not in prop:
            prop = {**prop, "enum": [prop["const"]]}
        string = (
            prop.get("type") == "string" or bool(prop.get("enum")) and all(isinstance(v, str) for v in prop["enum"])
        )
        as_string = _string_branch(prop) if not string else None  # a union that admits a string
        tag = _literal(f'parameter name="{key}" string="{"true" if string else "false"}">')
        name = f"value_{i}_{j}"
        value_rule = f"{name}: " + _json_rule(prop | value_definitions(prop, schema)) if not string else None
        rules.extend([value_rule] if value_rule is not None else _string_rules(name, prop))
        value = f"{tag} {name}"
        if as_string is not None:  # as V4 writes a str value: string="true" and the text as is
            rules.extend(_string_rules(f"text_{i}_{j}", as_string))
            value = f"({value} | " + _literal(f'parameter name="{key}" string="true">') + f" text_{i}_{j})"
        item = f'"<" {dsml} {value} "</" {dsml} "parameter>\\n"'
        body.append(f"({item})" if key in required else f"({item})?")
    params = " ".join(body) if required else ('"\\n"' if not props else "(" + " ".join(body) + ' | "\\n")')
    return [f'invoke_{i}: "<" {dsml} {head} {params} "</" {dsml} "invoke>"', *rules]


def _string_branch(prop: dict) -> dict | None:
    """The string schema a non-string-typed property also admits (None: it admits no string): a type
    list with "string" (OpenAI strict mode writes optional fields so), an anyOf / oneOf branch of
    type string, or no type at all. DeepSeek's encoder writes any str value with string="true"."""
    kind = prop.get("type")
    if isinstance(kind, list):
        return {k: v for k, v in prop.items() if k in ("minLength", "maxLength")} if "string" in kind else None
    for branch in prop.get("anyOf") or prop.get("oneOf") or ():
        if not isinstance(branch, dict):
            continue
        found = branch if branch.get("type") == "string" else _string_branch(branch)
        if found is not None:
            return found
    if kind is None and not any(
        k in prop for k in ("anyOf", "oneOf", "allOf", "enum", "const", "$ref", "properties", "items")
    ):
        return {}
    return None


class Unenforceable(ValueError):
    """Tool parameters whose schema a forced call's grammar cannot enforce: the gateway's 400."""


class UnenforceableString(Unenforceable):
    """A string parameter whose schema the raw (string="true") form cannot enforce."""


_STRING_KEYS = {"type", "enum", "const", "minLength", "maxLength", "description", "title", "default", "examples"}


def _string_rules(name: str, prop: dict) -> list[str]:
    """The rule ``name`` of a string="true" value, written as is, so it may hold anything but "<"
    (tags start with it). An enum is one lexeme (a terminal, as a JSON enum is): as a rule, each
    value was an item of the parser's row, and 2,000 values were past it (every such tool refused,
    after a compile of seconds for 20,000)."""
    if unsupported := sorted(set(prop) - _STRING_KEYS):  # pattern, format, ...: refused, never silently dropped
        raise UnenforceableString(f"string parameters cannot be constrained by {', '.join(unsupported)}")
    if prop.get("enum"):
        values = [_literal(v) for v in prop["enum"] if isinstance(v, str) and "<" not in v]
        if not values:
            raise UnenforceableString('every enum value of a string parameter contains "<"')
        return [f"{name}: {name.upper()}", f"{name.upper()}: " + " | ".join(values)]
    low, high = int(prop.get("minLength", 0)), prop.get("maxLength")
    return [f"{name}: " + (f"/[^<]{{{low},{int(high)}}}/" if high is not None else f"/[^<]{{{low},}}/")]
