"""MaxLengths clamped so that what a reply may write fits one grammar's lexer together
(dayzero.chat.schema_counts' ``length_cap``, applied by schema_openapi's ``as_llguidance``), and
never cut under what the schema needs."""

from __future__ import annotations

from collections import Counter

import pytest

from dayzero.chat import schema_openapi
from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.grammar import _byte_grammars, dsml_symbol, schema_problem, tool_calls_grammar
from dayzero.chat.schema_counts import MOST_COUNTED_CHARS
from dayzero.chat.schema_openapi import as_llguidance
from dayzero.chat.tokens import DSML

from .lexer_replies import longest_reply_fails, strings


@pytest.mark.parametrize(
    "bounds, clamped",
    [
        ((4000, 3999), (2000, 2000)),
        ((100_000,), (MOST_COUNTED_CHARS,)),
        ((100, 200, 1000, 5000), (100, 200, 1000, 2700)),  # the short kept, the long cut to what is left
    ],
)
def test_max_lengths_are_clamped_to_fit_the_lexer_together(bounds, clamped):
    """Each within a lexeme's bound, a maxLength of 4,000 and one of 3,999 let a reply writing 3,000
    characters in each fail ~5,560 bytes in."""
    schema = strings(*({"maxLength": bound} for bound in bounds))
    assert not longest_reply_fails(schema)
    written = as_llguidance(schema)
    assert tuple(p["maxLength"] for p in written["properties"].values()) == clamped


@pytest.mark.parametrize(
    "counts",
    [
        ({"pattern": "^[0-9]{3000}$", "maxLength": 5000},),
        ({"pattern": "^[0-9]{2000}$", "maxLength": 3000}, {"maxLength": 3000}),
    ],
    ids=["alone", "beside_another"],
)
def test_a_max_length_is_not_cut_under_what_its_pattern_counts(counts):
    """Its pattern's count and its maxLength were counted as two lexemes (llguidance's is one, their
    intersection), and the maxLength cut under the pattern's length (to 1,000; 1,000): nothing matched
    it and the schema, served before, was refused ("Unable to determine if regex is empty")."""
    schema = strings(*counts)
    assert schema_problem(schema) is None
    assert not longest_reply_fails(schema)


def _refers(ref: str, **beside) -> dict:  # an object of one required property, a plain $ref
    return {**strings(), "properties": {"a": {"$ref": ref}}, "required": ["a"], **beside}


LONG = {"type": "string", "maxLength": 100_000}
INNER = _refers("#/x-long", **{"$id": "https://example.com/inner", "x-long": LONG})


@pytest.mark.parametrize(
    "schema",
    [
        _refers("https://example.com/s#/x-long", **{"$id": "https://example.com/s", "x-long": LONG}),
        _refers("#/$defs/inner", **{"$defs": {"inner": INNER}}),
    ],
    ids=["after_the_roots_id", "within_a_definitions_id"],
)
def test_a_max_length_a_ref_reaches_after_an_id_is_clamped(schema):
    """A $ref to data after the root's $id, or "#/..." within a definition of its own $id (llguidance
    resolves it there): the rewrite followed "#/..." from the root only, the maxLength of 100,000
    stayed, and a reply writing it failed ~11,100 bytes in (é: past the lexer's states)."""
    assert not longest_reply_fails(schema)


NEEDS_3000 = {"type": "string", "minLength": 3000}


@pytest.mark.parametrize(
    "string",
    [
        {"allOf": [NEEDS_3000, {"maxLength": 3500}]},
        {"$ref": "#/$defs/long", "maxLength": 3500},
        {"anyOf": [NEEDS_3000, {"type": "null"}], "maxLength": 3500},
    ],
    ids=["all_of", "ref_beside", "union_beside"],
)
def test_a_max_length_is_not_cut_under_a_min_length_merged_with_it(string):
    """A minLength of 3,000 and a maxLength of 3,500 in two schemas llguidance merges into one
    string were counted as two (6,500) and the maxLength cut to 1,000: the schema, within the
    lexer and served before, was refused ("minLength (3000) is greater than maxLength (1000)")."""
    schema = {**strings(string), "$defs": {"long": NEEDS_3000}}
    assert schema_problem(schema) is None
    assert not longest_reply_fails(schema)


def test_max_lengths_of_forced_tools_are_clamped_together():
    """Two tools, each a string of a maxLength within the lexer alone (4,000; 3,999): their calls
    in one reply (one grammar: one lexer's states) failed ~5,560 bytes in, each tool's clamped on
    its own. Walked here as a reply writing both calls, each string as long as the grammar lets it."""
    tools = [
        {"type": "function", "function": {"name": name, "parameters": strings({"maxLength": 4000 - i})}}
        for i, name in enumerate("fg")
    ]
    matcher = _byte_grammars().matcher(tool_calls_grammar(tools, dsml_symbol(None, DSML)))
    tag = "<" + DSML
    calls = [f'{tag}invoke name="{name}">\n{tag}parameter name="s0" string="true">' for name in "fg"]
    pieces = [
        "\n\n" + tag + "tool_calls>\n" + calls[0],
        None,
        f"</{DSML}parameter>\n</{DSML}invoke>\n" + calls[1],
        None,
    ]
    written = []
    for piece in pieces:
        count = 0
        for byte in piece.encode() if piece is not None else iter(lambda: ord("a"), None):
            mask = matcher.compute_logit_bias()
            assert not matcher.is_error(), matcher.get_error()[:80]
            if piece is None and mask[byte] != 200:
                break
            matcher.consume_token(byte)
            count += 1
        written.append(count)
    assert not matcher.is_error(), (written, matcher.get_error()[:80])
    assert sum(written[1::2]) <= MOST_COUNTED_CHARS, written


def test_the_bounds_of_a_calls_tools_are_read_once_for_all_of_them(monkeypatch):
    """Each tool's were read with every enforced tool's, once per tool: 128 forced tools read
    16,384 schemas, 8 -> 178 ms of the gateway's CPU for a request's grammar (1,024: 60 ms -> 11 s)."""
    read, cap = Counter(), schema_openapi.length_cap

    def counting(groups):
        groups = list(groups)
        read.update(id(node) for group in groups for node in group)
        return cap(groups)

    monkeypatch.setattr(schema_openapi, "length_cap", counting)
    tools = [
        {
            "type": "function",
            "function": {"name": f"f{i}", "parameters": strings({"maxLength": 1000 + i}), "strict": True},
        }
        for i in range(8)
    ]
    for grammar in (tool_calls_grammar, auto_calls_grammar):
        read.clear()
        assert "{0,500}" in grammar(tools, dsml_symbol(None, DSML))  # 8 strings share 4,000
        assert [read[id(tool["function"]["parameters"])] for tool in tools] == [1] * len(tools), grammar.__name__
