"""The characters llguidance's lexer counts across one grammar (dayzero.chat.schema_counts), checked
against llguidance itself: what is refused fails a reply that writes it, what is let through does not."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from dayzero.chat import schema_openapi
from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.grammar import _byte_grammars, dsml_symbol, json_grammar, schema_problem, tool_calls_grammar
from dayzero.chat.schema_counts import MOST_COUNTED_CHARS, counted_repeats, counted_weight
from dayzero.chat.schema_openapi import as_llguidance
from dayzero.chat.schema_size import SchemaLimits, size_problem
from dayzero.chat.tokens import DSML

DEFAULTS = SchemaLimits(nodes=3000, literal_chars=100_000, pattern_chars=20_000)


@pytest.mark.parametrize(
    "regex, count",
    [
        ("^.{3000}$", 3000),
        ("^(.{100}){60}$", 6000),  # a group's count times its own
        ("((a{10}){10}){100}", 10_000),
        ("^.{3000}-.{2900}$", 5900),  # a sequence's counts add up
        ("(?:a{3}b{4}){2}", 14),
        ("a{1,30000}", 30_000),  # the larger bound
        ("(abc){2000}", 2000),  # a group with no count of its own: its count alone
        ("[a-z{5}]{7}", 7),  # a class is one character
        (r"\{5}", 0),  # an escaped brace counts nothing
        ("abc", 0),
        ("a{" + "9" * 4400 + "}", 10**12),  # (Python reads no number of over 4,300 digits)
        ("(" * 44 + "a" + ("){" + "9" * 100 + "}") * 44, 10**12),  # (nor writes one: 4,400 digits)
    ],
)
def test_counted_repeats(regex, count):
    assert counted_repeats(regex) == count


def _strings(*counts: dict) -> dict:
    properties = {f"s{i}": {"type": "string", **counted} for i, counted in enumerate(counts)}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _fails_mid_reply(schema: dict, reply: dict) -> bool:
    """Whether llguidance (the gateway's limits) fails writing ``reply`` a byte a step, each step's
    mask computed as in decoding (where its lexer builds its states)."""
    matcher = _byte_grammars().matcher(json_grammar(schema))
    assert not matcher.is_error()
    for byte in json.dumps(reply, ensure_ascii=False).encode():  # (as a model writes: UTF-8, no escapes)
        matcher.compute_logit_bias()
        matcher.consume_token(byte)
        if matcher.is_error():
            return "lexer error: too many" in matcher.get_error()  # (states, or expressions)
    return False


@pytest.mark.parametrize(
    "counts",
    [
        ({"minLength": 3000}, {"minLength": 2900}),
        ({"pattern": "^.{3000}$"}, {"pattern": "^.{2900}$"}),
        ({"minLength": 3000}, {"pattern": "^.{2900}$"}),
        ({"pattern": "^(.{100}){60}$"},),
    ],
    ids=["min_lengths", "patterns", "both", "nested"],
)
def test_counts_past_the_lexer_together_are_refused(counts):
    """Each within a lexeme's bound (but nested), together past the lexer's states: every reply
    writing them failed ~5,560 bytes in."""
    schema = _strings(*counts)
    lengths = [c.get("minLength") or counted_repeats(c["pattern"]) for c in counts]
    assert _fails_mid_reply(schema, {f"s{i}": "a" * n for i, n in enumerate(lengths)})
    problem = size_problem([schema], DEFAULTS) or ""
    named = [
        f"minLength {n:,}" if "minLength" in c else f"regular expression counting {n:,}"
        for c, n in zip(counts, lengths, strict=True)
    ]
    assert any(name in problem for name in named) and f"at most {MOST_COUNTED_CHARS:,}" in problem, problem


def test_counts_are_summed_once_a_lexeme_and_across_schemas():
    """The same string schema in two properties (or an array's items) is one lexeme: counted once;
    two schemas of one request (tools' parameters) are one grammar: counted together."""
    half = {"minLength": MOST_COUNTED_CHARS // 2 + 1}
    assert size_problem([_strings(half, half)], DEFAULTS) is None
    assert not _fails_mid_reply(_strings(half, half), {"s0": "a" * half["minLength"], "s1": "b" * half["minLength"]})
    other = {"minLength": MOST_COUNTED_CHARS // 2}
    assert size_problem([_strings(half), _strings(other)], DEFAULTS) is not None
    assert size_problem([_strings(other), _strings(other)], DEFAULTS) is None


def test_the_most_let_through_is_written_whole():
    schema = _strings({"minLength": MOST_COUNTED_CHARS - 1000}, {"pattern": "^.{1000}$"})
    assert size_problem([schema], DEFAULTS) is None
    assert not _fails_mid_reply(schema, {"s0": "a" * (MOST_COUNTED_CHARS - 1000), "s1": "b" * 1000})


@pytest.mark.parametrize(
    "regex, weight",
    [
        ("^[a-z]{6000}$", 667),  # a class of ASCII characters: 1 of the lexer's states a character, not 9
        (r"^\d{900}[\-_A-Z]{900}\w{900}$", 300),  # (\d, \w: ASCII in llguidance's regexes)
        ("^.{6000}$", 6000),
        ("^[^a]{90}[a-zé]{90}\\s{90}[\\p{L}]{90}a{90}$", 450),  # negated, non-ASCII, \s, \p, a literal: 9
        (r"^[\x20-\x7e]{900}[\x{10000}-\x{10FFFF}]{90}[\u00e9]{90}$", 280),  # \x{..}, \u: non-ASCII ones
        ("(?i)^[a-z]{900}$", 900),  # case-insensitive: [a-z] holds the Kelvin sign, the long s
        (r"^(\d{1,2}){900}[0-9]{900}$", 1900),  # within a counted group (at the top: a ninth)
    ],
)
def test_counted_weight(regex, weight):
    assert counted_weight(regex) == weight


def test_a_class_of_ascii_characters_is_counted_by_the_states_it_builds():
    """``^[a-z]{6000}$`` builds ~6,000 of the lexer's 50,000 states, where ``.{6000}`` fails at byte
    5,554: it was refused with ``.``'s count, and a reply writes it whole; two of 30,000 together
    are still refused (a reply failed ~50,000 bytes in)."""
    narrow = _strings({"pattern": "^[a-z]{6000}$"}, {"pattern": "^\\d{6000}$"})
    assert size_problem([narrow], DEFAULTS) is None
    assert not _fails_mid_reply(narrow, {"s0": "q" * 6000, "s1": "7" * 6000})
    both = _strings({"pattern": "^[a-z]{30000}$"}, {"pattern": "^[0-9]{30000}$"})
    assert "counting 3,334 repeats (a class of ASCII characters" in size_problem([both], DEFAULTS)
    assert _fails_mid_reply(both, {"s0": "q" * 30000, "s1": "7" * 30000})


@pytest.mark.parametrize(
    "regex, text",
    [
        (r"^[\x{10000}-\x{10FFFF}]{30000}$", "\U0001f600" * 30000),
        ("(?i)^[a-z]{30000}$", "q" * 30000),
        (r"^(\d{1,2}){18000}$", "7" * 36000),
    ],
    ids=["astral_class", "caseless", "counted_group"],
)
def test_a_class_a_ninth_would_let_through_fails_the_lexer(regex, text):
    """Each weighed a ninth (3,334; 3,334; 4,000: let through) though its states are more than one
    a character: every reply writing it failed 33,319, 16,663 or 2,227 bytes in (too many states;
    too many expressions)."""
    schema = _strings({"pattern": regex})
    assert "a regular expression counting" in (size_problem([schema], DEFAULTS) or "")
    assert _fails_mid_reply(schema, {"s0": text})


def _longest_reply_fails(schema: dict) -> bool:
    """Whether the reply writing each string as long as the grammar lets it (an "a" wherever one is
    allowed, else the lowest byte allowed) fails on llguidance's lexer: as a model that writes on."""
    matcher, end = _byte_grammars().matcher(json_grammar(schema)), _byte_grammars().tokenizer.eos_token
    for _ in range(20_000):
        mask = matcher.compute_logit_bias()
        if matcher.is_error():
            return "too many states" in matcher.get_error()
        allowed = [token for token in range(256) if mask[token] == 200 and token != end]
        if not allowed:
            return False
        matcher.consume_token(ord("a") if ord("a") in allowed else allowed[0])
    raise AssertionError("no end within 20,000 bytes")


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
    schema = _strings(*({"maxLength": bound} for bound in bounds))
    assert not _longest_reply_fails(schema)
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
    schema = _strings(*counts)
    assert schema_problem(schema) is None
    assert not _longest_reply_fails(schema)


def _refers(ref: str, **beside) -> dict:  # an object of one required property, a plain $ref
    return {**_strings(), "properties": {"a": {"$ref": ref}}, "required": ["a"], **beside}


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
    assert not _longest_reply_fails(schema)


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
    schema = {**_strings(string), "$defs": {"long": NEEDS_3000}}
    assert schema_problem(schema) is None
    assert not _longest_reply_fails(schema)


def test_max_lengths_of_forced_tools_are_clamped_together():
    """Two tools, each a string of a maxLength within the lexer alone (4,000; 3,999): their calls
    in one reply (one grammar: one lexer's states) failed ~5,560 bytes in, each tool's clamped on
    its own. Walked here as a reply writing both calls, each string as long as the grammar lets it."""
    tools = [
        {"type": "function", "function": {"name": name, "parameters": _strings({"maxLength": 4000 - i})}}
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
            "function": {"name": f"f{i}", "parameters": _strings({"maxLength": 1000 + i}), "strict": True},
        }
        for i in range(8)
    ]
    for grammar in (tool_calls_grammar, auto_calls_grammar):
        read.clear()
        assert "{0,500}" in grammar(tools, dsml_symbol(None, DSML))  # 8 strings share 4,000
        assert [read[id(tool["function"]["parameters"])] for tool in tools] == [1] * len(tools), grammar.__name__


def test_a_refusal_says_ninths_only_where_it_weighed_them():
    wide = size_problem([{"type": "string", "pattern": "^.{5000}$"}], DEFAULTS)
    assert wide.startswith("a regular expression counting 5,000 repeats: "), wide
    narrow = size_problem([{"type": "string", "pattern": "^[a-z]{45000}$"}], DEFAULTS)
    assert narrow.startswith("a regular expression counting 5,000 repeats (a class of ASCII characters"), narrow
