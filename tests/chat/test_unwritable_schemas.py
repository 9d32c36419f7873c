"""A schema whose values the grammar engine cannot write (its lexer past its limits) is told so,
not that nothing satisfies it: it may well be satisfiable (^(ab)*(ab){1000}$ is)."""

from __future__ import annotations

import pytest

from dayzero.chat.grammar import grammar_problem, json_grammar, schema_problem

NOTHING = "nothing satisfies it"
CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
TOO_COMPLEX = "lexer error: too many expressions constructed"  # (llguidance's words, kept in the message)


@pytest.mark.parametrize(
    "pattern",
    ["^(ab)*(ab){1000}$", "^((a{1000}){1000}){100}$"],
)
def test_a_pattern_past_the_lexer_is_told_it_cannot_be_written_at_every_walk(pattern):
    """The lexer's states are shared by every walk of one grammar: its first walk failed a byte in
    ("lexer error: ..."), every later one at the first byte, told NOTHING."""
    schema = {"type": "string", "pattern": pattern}
    told = [schema_problem(schema) for _ in range(3)]
    assert all(TOO_COMPLEX in problem and "satisfy it" in problem for problem in told), told
    assert not any(NOTHING in problem for problem in told), told


def test_the_same_over_the_models_vocabulary(codec):
    x = {"type": "string", "pattern": "^(a+){100}$"}
    lark = json_grammar({"type": "object", "properties": {"x": x}, "required": ["x"]})
    told = [grammar_problem(lark, codec.grammars) for _ in range(3)]
    assert all(TOO_COMPLEX in problem and NOTHING not in problem for problem in told), told


def test_a_schema_nothing_satisfies_is_still_told_so():
    assert NOTHING in schema_problem(CYCLE)
