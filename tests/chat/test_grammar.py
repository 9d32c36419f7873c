"""Grammar checks: what llguidance cannot enforce is named in short, before any request queues."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dayzero.chat.grammar import _byte_grammars, grammar_problem, json_grammar, schema_problem, tool_calls_grammar

from ..grammar_cases import FAILING_LATE, LATE_PATTERN, late

NOTHING = "nothing satisfies it (such as a $ref that only refers to itself)"
CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}  # the QA report's


@pytest.fixture(scope="module")
def grammars(codec):
    return codec.grammars


@pytest.mark.parametrize(
    "schema",
    [CYCLE, {"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}}}],
)
def test_a_ref_cycle_that_never_produces_a_value_is_refused(schema):
    assert schema_problem(schema) == NOTHING


def test_a_lexer_past_its_limits_is_not_read_as_nothing_satisfying_it():
    """/(a+){300}/ ("a" * 300 satisfies it) fails llguidance's lexer; checked again, the compiled
    grammar's copy (its lexer shared) fails at its first step: it was refused "nothing satisfies it"."""
    lark = "start: /(a+){300}/\n"
    for _ in range(2):
        problem = grammar_problem(lark, _byte_grammars())
        assert "lexer error: too many expressions constructed" in problem and "nothing satisfies" not in problem


def test_the_check_does_not_depend_on_the_vocabulary(grammars):
    assert grammar_problem(json_grammar(CYCLE), grammars) == NOTHING
    assert grammar_problem(json_grammar({"type": "object"}), grammars) is None


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {},
        {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}},  # null ends it
        {"$ref": "#/$defs/t", "$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}},  # [] ends it
    ],
)
def test_schemas_with_values_pass(schema):
    assert schema_problem(schema) is None


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "objectx"}, "Invalid type: objectx"),
        ({"not": {}}, 'Unimplemented keys: ["not"]'),
        (
            {"type": "integer", "minimum": 5, "maximum": 1},
            "Unsatisfiable schema: minimum (5) is greater than maximum (1)",
        ),
    ],
)
def test_a_schema_llguidance_cannot_compile_is_named_without_the_grammar_text(schema, why):
    assert schema_problem(schema) == why


@pytest.mark.parametrize(
    ("schema", "named"), [({"enum": ["\ud800"]}, "d800"), ({"type": "string", "description": "a \udfff"}, "dfff")]
)
def test_a_lone_surrogate_is_named_without_the_grammar_text(schema, named):
    """JSON may escape one (a body's "\\ud800" parses to it); llguidance refused the grammar quoting
    all of its text (ours: "start: %json ... x-guidance ...") as the client's 400."""
    assert schema_problem(schema) == f"a string holds a lone surrogate (\\u{named}): not Unicode, it cannot be enforced"


def test_a_tool_parameters_ref_resolves_in_the_call_grammar(grammars):
    ref = {"$ref": "#/$defs/n"}
    parameters = {"type": "object", "properties": {"k": ref}, "required": ["k"], "$defs": {"n": {"type": "integer"}}}
    lark = tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": parameters}}], '"|DSML|"')
    assert grammar_problem(lark, grammars) is None
    assert grammar_problem(json_grammar(ref), grammars) == "Pointer '/$defs/n' does not exist"  # alone, it dangles


def _accepts(lark: str, text: str) -> bool:
    import llguidance

    from dayzero.chat.grammar import _byte_tokenizer

    matcher, data = llguidance.LLMatcher(_byte_tokenizer(), lark, log_level=0), list(text.encode())
    return matcher.try_consume_tokens(data) == len(data) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("prop", "as_text", "value", "as_json"),
    [
        ({"type": ["string", "null"]}, True, "null", True),  # OpenAI strict mode's optional field
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, True, "7", True),
        ({"description": "no type"}, True, "7", True),
        ({"type": "string"}, True, "7", False),
        ({"type": "integer"}, False, "7", True),
    ],
)
def test_a_forced_call_takes_a_string_as_v4_writes_it(prop, as_text, value, as_json):
    """DeepSeek's encoder writes any str argument as string="true" and the text as is (FACTS: the
    chat encoding); a property whose schema admits a string takes that form, and the JSON form
    (string="false") where the schema admits one."""
    parameters = {"type": "object", "properties": {"id": prop}, "required": ["id"]}
    lark = tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": parameters}}], '"|DSML|"')

    def call(parameter: str) -> str:
        invoke = f'<|DSML|invoke name="f">\n<|DSML|{parameter}</|DSML|parameter>\n</|DSML|invoke>'
        return f"\n\n<|DSML|tool_calls>\n{invoke}\n</|DSML|tool_calls>"

    assert _accepts(lark, call('parameter name="id" string="true">abc')) == as_text
    assert _accepts(lark, call(f'parameter name="id" string="false">{value}')) == as_json


def test_boolean_and_const_parameter_schemas(grammars):
    """``true`` (anything) and ``false`` (nothing: left out) are JSON Schemas too (each was a 500);
    a ``const`` string is the one value allowed."""
    parameters = {"type": "object", "properties": {"any": True, "none": False, "c": {"const": "x"}}, "required": ["c"]}
    lark = tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": parameters}}], '"|DSML|"')
    assert grammar_problem(lark, grammars) is None

    def call(body: str) -> str:
        return f'\n\n<|DSML|tool_calls>\n<|DSML|invoke name="f">\n{body}</|DSML|invoke>\n</|DSML|tool_calls>'

    c = '<|DSML|parameter name="c" string="true">{}</|DSML|parameter>\n'
    anything = '<|DSML|parameter name="any" string="false">[1, {"a": null}]</|DSML|parameter>\n'
    assert _accepts(lark, call(anything + c.format("x")))
    assert not _accepts(lark, call(c.format("y")))
    assert not _accepts(lark, call('<|DSML|parameter name="none" string="false">1</|DSML|parameter>\n' + c.format("x")))


@pytest.mark.parametrize(
    "prop", [{"type": "string", "pattern": "^a"}, {"type": "string", "format": "date"}, {"enum": ["<a>", "<b>"]}]
)
def test_a_string_constraint_the_raw_form_cannot_keep_is_named(prop):
    from dayzero.chat.grammar import UnenforceableString

    parameters = {"type": "object", "properties": {"k": prop}}
    with pytest.raises(UnenforceableString):
        tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": parameters}}], '"|DSML|"')


@pytest.mark.parametrize(
    "schema",
    [*FAILING_LATE, {"type": "string", "pattern": "^((a{1000}){1000}){100}$"}],  # (past the lexer's limits)
)
def test_a_schema_whose_grammar_fails_after_its_first_step_is_refused(schema):
    """Each passed a first-step check, then every reply ended after one token as "stop", unparsable."""
    assert schema_problem(schema) is not None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"type": "string", "pattern": "^((a{1000}){1000}){100}$"}, "lexer error: too many expressions constructed"),
        ({"$ref": "#/$defs/n"}, "parser error: Too many items"),  # (an object requiring itself: nothing finite)
    ],
)
def test_a_required_value_failing_a_few_properties_in_is_refused(value, why):
    """Four properties in, past the 8 steps the check walked: each passed it, then failed every reply
    there (mid-way: a 500). The check walks 256 bytes now, a quote first (a string ends soon); at 64
    bytes twelve properties in (~170 bytes) passed it, then failed every reply there (a 400 after a
    200 stream began; 0.2 -> 0.8 ms a walk, bench/schema_walk.py)."""
    for flags in (4, 12):
        schema = late(value, flags) | {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}}
        schema["$defs"]["n"]["required"] = ["c"]
        assert why in schema_problem(schema), flags  # (a lexer's: in the words of UNWRITABLE)
    assert schema_problem(LATE_PATTERN) is None  # (further in: a reply may still fail there, guided.GrammarFailed)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "exclusiveMinimum": 10**20, "maximum": 10**21},  # 2^63 - 1 came out
        {"type": "integer", "minimum": 10**19, "maximum": 10**19 + 5},
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2**63, "maximum": 2**64}}},
        {"anyOf": [{"type": "integer", "exclusiveMinimum": 2**63 - 1, "maximum": 2**64}, {"type": "null"}]},
    ],
)
def test_integer_bounds_past_64_bits_are_refused_not_clamped(schema):
    assert "past the 64-bit range" in schema_problem(schema)


BOTTOM = {"type": "integer", "minimum": -(2**63) + 1, "maximum": -(2**63) + 5}


@pytest.mark.parametrize(
    "schema",
    [
        BOTTOM,
        {"type": "object", "properties": {"default": BOTTOM}},  # (a property's name, taken for data: unchecked)
        {"const": -(2**63) + 100},  # a const or enum value is both its bounds (refused within 2^32, as they are)
        {"type": "object", "properties": {"k": {"enum": [0, {"a": [-(2**63)]}]}}},
    ],
)
def test_a_range_at_the_bottom_of_64_bits_is_refused_before_llguidance_crashes_on_it(schema):
    """llguidance segfaulted building it: the gateway's check ran in its process (one request ended it)."""
    code = f"from dayzero.chat.grammar import schema_problem; print(schema_problem({schema!r}))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "past the 64-bit range" in run.stdout, (run.returncode, run.stderr[-300:])


def test_bounds_within_64_bits_and_bound_like_data_pass():
    assert schema_problem({"type": "integer", "minimum": 0, "maximum": 10**21}) is None  # clamped: still inside
    assert schema_problem({"type": "integer", "minimum": -(2**62), "maximum": 2**62}) is None
    assert schema_problem({"const": {"minimum": 10**20}}) is None  # a value, not a bound


# a tree whose kids are whole parameters objects ({"tree": ...}); closed at both levels
TREE = {"type": "object", "properties": {"tree": {"type": "object", "additionalProperties": False}}}
TREE["properties"]["tree"]["properties"] = {"kids": {"type": "array", "items": {"$ref": "#"}}}
TREE["additionalProperties"] = False


def _forced_call(parameters: dict) -> str:
    return tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": parameters}}], '"|DSML|"')


@pytest.mark.parametrize(
    ("parameters", "why"),
    [
        ({"type": "object", "properties": {}, "required": ["q"]}, 'required ["q"]: not among the properties'),
        ({"properties": {"a": {}}, "minProperties": 1, "additionalProperties": False}, "minProperties"),
        ({"anyOf": [{"properties": {"a": {}}, "required": ["a"]}, {"required": ["b"]}]}, "anyOf"),
        ({"type": "object", "properties": {"a": {}}, "patternProperties": {"^a": {"type": "integer"}}}, "patternProp"),
        ({"$ref": "#/$defs/p", "$defs": {"p": {"type": "object", "required": ["x"]}}}, "$ref"),
        ({"type": "string"}, 'not "string"'),
        (TREE, '$ref only into $defs or definitions, not ["#"]'),  # "#" was the property: kids came out wrong
    ],
)
def test_a_forced_call_refuses_parameter_keywords_it_would_drop(parameters, why):
    """The call's grammar writes declared properties only: each of these came back as arguments
    the tool's schema refuses ("{}" for a required name not among the properties, or minProperties)."""
    from dayzero.chat.grammar import Unenforceable

    assert schema_problem(parameters) is None  # as JSON each is fine: only the call's form loses them
    with pytest.raises(Unenforceable, match=re.escape(why)):
        _forced_call(parameters)


def test_a_forced_call_keeps_openai_strict_parameters(grammars):
    parameters = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": ["integer", "null"]}},
        "required": ["a", "b"],
        "additionalProperties": False,
        "$defs": {},
        "description": "d",
    }
    assert grammar_problem(_forced_call(parameters), grammars) is None


def test_a_string_parameters_enum_is_one_lexeme(grammars):
    """As a rule of alternatives each value was an item of the parser's row: 2,000 values were past
    it (every such forced call refused, after a compile of 2-4 s for 17,000-19,000 values); one
    lexeme (a terminal, as a JSON enum is) takes 5,000, a value that begins another and an empty one."""
    values = [f"v{i}" for i in range(5000)] + [""]
    lark = _forced_call({"type": "object", "properties": {"k": {"type": "string", "enum": values}}, "required": ["k"]})
    assert grammar_problem(lark, grammars) is None

    def call(value: str) -> str:
        parameter = f'<|DSML|parameter name="k" string="true">{value}</|DSML|parameter>\n'
        return f'\n\n<|DSML|tool_calls>\n<|DSML|invoke name="f">\n{parameter}</|DSML|invoke>\n</|DSML|tool_calls>'

    assert all(_accepts(lark, call(value)) for value in ("v1", "v10", "v4999", ""))
    assert not _accepts(lark, call("v5000")) and not _accepts(lark, call("v1 "))


TWO_TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in "fg"]


def _block(*names: str) -> str:
    invokes = [f'<|DSML|invoke name="{name}">\n\n</|DSML|invoke>' for name in names]
    return "\n\n<|DSML|tool_calls>\n" + "\n".join(invokes) + "\n</|DSML|tool_calls>"


def test_a_forced_call_grammar_takes_parallel_calls():
    """tool_choice required: one or more calls (a second call's ``<`` was refused after the first's
    newline, which the lexer took as the start of the block's close: never more than one call)."""
    lark = tool_calls_grammar(TWO_TOOLS, '"|DSML|"')
    assert _accepts(lark, _block("g")) and _accepts(lark, _block("f", "g")) and _accepts(lark, _block("g", "g", "f"))


def test_a_forced_call_grammar_holds_parallel_tool_calls_false_to_one_call():
    """``parallel_tool_calls: false`` under tool_choice required: one call, to any of the tools."""
    lark = tool_calls_grammar(TWO_TOOLS, '"|DSML|"', parallel=False)
    assert _accepts(lark, _block("g")) and _accepts(lark, _block("f"))
    assert not _accepts(lark, _block("f", "g"))
