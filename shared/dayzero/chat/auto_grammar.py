"""The grammar of a reply under tool_choice "auto" that offers a ``strict`` tool (OpenAI's promise:
a strict tool's call follows its schema whenever the model makes one): the text, thought and
answer alike, as free as without a grammar, and each DSML block held to the tools' calls, a strict
tool's arguments to its schema (chat.grammar's invoke rules), another tool's as written.

Free text may hold no DSML marker (the token, or its text spelled in pieces: the reply parser reads
either as one), so a marker can only open a block; nor a special token the reply's text leaves out
(``<｜User｜>``, ...: the text on either side of it would join, and could spell the marker). Text is
lexed in pieces between the ``<`` that may open a tag: one lexeme holding a ``<`` took it from the
tag that followed (llguidance's lexer is greedy and does not go back).
"""

from __future__ import annotations

from .dsml import to_json
from .grammar import invoke_rules
from .schema_openapi import grammar_cap
from .tokens import DSML

# text without "<" or the marker's text (llguidance's regex: & intersects, ~ complements)
_PIECE = "/[^<]+/ & ~/(?s:.*" + DSML + ".*)/"


def strict_tools(tools: list[dict]) -> list[dict]:
    """The tools (OpenAI tool dicts) whose calls must follow their schemas: ``strict: true``."""
    return [t for t in tools if t["function"].get("strict") is True]


def auto_calls_grammar(tools: list[dict], dsml: str, kept: tuple[str, ...] = (), parallel: bool = True) -> str:
    """Free text (``kept``: the special tokens it may hold, as grammar symbols) and DSML blocks of
    calls to ``tools`` (OpenAI tool dicts), one call in all when not ``parallel``."""
    strict = [t["function"] for t in strict_tools(tools)]
    free = [t["function"] for t in tools if t not in strict_tools(tools)]
    tail = "(block text)*" if parallel else "(block text)?"
    lines = [
        f"start: text {tail}",
        "text: PIECE? (lt PIECE?)*" if not kept else f"text: PIECE? ((lt | {' | '.join(kept)}) PIECE?)*",
        'lt: "<"',  # (a rule of its own: the "<" opening a tag is the same lexeme)
        f"PIECE: {_PIECE}",
        f'block: "<" {dsml} "tool_calls>\\n" calls "\\n" "<" "/" {dsml} "tool_calls>"',
        "calls: call" if not parallel else 'calls: call ("\\n" call)*',
        "call: " + " | ".join([f"invoke_{i}" for i in range(len(strict))] + ["free_invoke"] * bool(free)),
    ]
    cap = grammar_cap(f.get("parameters") or {} for f in strict)
    lines.extend(rule for i, function in enumerate(strict) for rule in invoke_rules(i, function, dsml, cap))
    if free:
        names = " | ".join(to_json(f'invoke name="{f["name"]}">\n') for f in free)
        lines += [
            f'free_invoke: "<" {dsml} ({names}) free_parameter* "<" "/" {dsml} "invoke>"',
            f'free_parameter: "<" {dsml} "parameter name=\\"" NAME "\\" string=\\"" ("true" | "false") "\\">"'
            f' value "<" "/" {dsml} "parameter>\\n"',
            'NAME: /[^"<\\n]*/',
            "value: PIECE? (lt PIECE?)*",
        ]
    return "\n".join(lines) + "\n"
