"""OpenAPI's discriminator (pydantic's tagged unions) dropped before llguidance compiles a schema
(dayzero.chat.schema_discriminator): the grammar allows what the model validates, no more, no less."""

from __future__ import annotations

import json
import random
from typing import Annotated, Literal

import jsonschema_rs
import pytest
from pydantic import BaseModel, Field, ValidationError

from dayzero.chat.grammar import json_grammar, schema_problem, tool_calls_grammar
from dayzero.chat.schema_size import SchemaLimits, size_problem

from .test_grammar import _accepts

DEFAULTS = SchemaLimits(3000, 120_000, 10_000)


class Leaf(BaseModel):
    kind: Literal["leaf"]
    value: int


class Add(BaseModel):
    kind: Literal["add"]
    left: Expr
    right: Expr


class Mul(BaseModel):
    kind: Literal["mul"]
    left: Expr
    right: Expr


class Neg(BaseModel):
    kind: Literal["neg"]
    arg: Expr


Expr = Annotated[Leaf | Add | Mul | Neg, Field(discriminator="kind")]


class Formula(BaseModel):
    name: str
    expr: Expr


for _model in (Add, Mul, Neg, Formula):
    _model.model_rebuild()
SCHEMA = Formula.model_json_schema()


def _tree(rng: random.Random, depth: int) -> dict:
    kind = rng.choice(["leaf"] if depth == 0 else ["leaf", "add", "mul", "neg"])
    if kind == "leaf":
        return {"kind": kind, "value": rng.randint(-9, 99)}
    if kind == "neg":
        return {"kind": kind, "arg": _tree(rng, depth - 1)}
    return {"kind": kind, "left": _tree(rng, depth - 1), "right": _tree(rng, depth - 1)}


def _nodes(value: dict) -> list[dict]:
    return [value, *(n for v in value.values() if isinstance(v, dict) for n in _nodes(v))]


def _mutated(rng: random.Random, formula: dict) -> dict:
    """``formula`` with one node's kind swapped, one of its fields dropped, or its value a string."""
    node = rng.choice(_nodes(formula["expr"]))
    change = rng.choice(["kind", "drop", "string"])
    if change == "kind":
        node["kind"] = rng.choice(["leaf", "add", "mul", "neg", "sub"])
    elif change == "drop":
        del node[rng.choice(list(node))]
    else:
        node["value" if "value" in node else "kind"] = "7"
    return formula


def _instances() -> list[str]:
    rng, found = random.Random(7), []
    for _ in range(60):
        formula = {"name": "f", "expr": _tree(rng, rng.randint(0, 4))}
        found.append(json.dumps(formula))
        found.append(json.dumps(_mutated(rng, json.loads(found[-1]))))
    return found


def _valid(text: str) -> bool:
    try:
        Formula.model_validate_json(text, strict=True)
    except ValidationError:
        return False
    return True


def test_a_recursive_tagged_union_is_accepted():
    """It was refused: "circular references with sibling keys" (the discriminator beside each
    ``oneOf`` taken for a constraint, the union copied under it in each branch)."""
    assert "discriminator" in json.dumps(SCHEMA)  # (pydantic still writes one)
    assert size_problem([SCHEMA], DEFAULTS) is None
    assert schema_problem(SCHEMA) is None


def test_its_grammar_accepts_what_the_model_validates_and_nothing_else():
    """The model's validation and its schema's (as written: oneOf, discriminator) agree on each."""
    lark, instances, schema = json_grammar(SCHEMA), _instances(), jsonschema_rs.validator_for(SCHEMA)
    assert all(schema.is_valid(json.loads(text)) == _valid(text) for text in instances)
    verdicts = [(_accepts(lark, text), _valid(text)) for text in instances]
    assert sum(valid for _, valid in verdicts) >= 60 and sum(not valid for _, valid in verdicts) >= 30  # both kinds
    assert [text for text, (accepted, valid) in zip(instances, verdicts, strict=True) if accepted != valid] == []


def test_a_tool_whose_parameter_is_a_tagged_union_is_enforced():
    lark = tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}], '"|DSML|"')
    value = json.dumps({"kind": "neg", "arg": {"kind": "leaf", "value": 1}})

    def call(expr: str) -> str:
        name = '<|DSML|parameter name="name" string="true">f</|DSML|parameter>\n'
        parameter = f'<|DSML|parameter name="expr" string="false">{expr}</|DSML|parameter>\n'
        return f'\n\n<|DSML|tool_calls>\n<|DSML|invoke name="f">\n{name}{parameter}</|DSML|invoke>\n</|DSML|tool_calls>'

    assert _accepts(lark, call(value))
    assert not _accepts(lark, call(value.replace('"neg"', '"add"')))


@pytest.mark.parametrize(
    "tags",
    [["a", "a"], ["a", None]],  # two branches may match one value: a oneOf llguidance cannot enforce
)
def test_a_one_of_its_discriminator_does_not_tell_apart_stays_one_of(tags):
    def branch(tag: str | None) -> dict:
        kind = {"const": tag} if tag is not None else {"type": "string"}
        return {"type": "object", "properties": {"k": kind}, "required": ["k"]}

    defs = {f"b{i}": branch(tag) for i, tag in enumerate(tags)}
    refs = [{"$ref": f"#/$defs/{name}"} for name in defs]
    schema = {"oneOf": refs, "discriminator": {"propertyName": "k"}, "$defs": defs}
    assert "oneOf" in schema_problem(schema)


def test_a_property_named_discriminator_is_kept():
    schema = {"type": "object", "properties": {"discriminator": {"type": "integer"}}, "required": ["discriminator"]}
    lark = json_grammar(schema)
    assert _accepts(lark, '{"discriminator": 1}') and not _accepts(lark, "{}")


def test_a_one_of_under_an_id_is_told_apart_by_its_own_definitions():
    """``#/$defs/a`` under an ``$id`` is that resource's ``a`` (llguidance's lookup, as JSON Schema's):
    looked up from the document's root, whose ``a`` and ``b`` differ, the oneOf was written as anyOf
    and its grammar accepted ``{"k": "a"}``, which both of the resource's own branches match (oneOf:
    invalid)."""

    def tagged(tag: str) -> dict:
        return {"type": "object", "properties": {"k": {"const": tag}}, "required": ["k"]}

    refs = [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]
    inner = {"$id": "http://x/inner.json", "$defs": {"a": tagged("a"), "b": tagged("a")}, "oneOf": refs}
    inner["discriminator"] = {"propertyName": "k"}
    schema = {"$id": "http://x/root.json", "$defs": {"inner": inner, "a": tagged("p"), "b": tagged("q")}}
    schema["$ref"] = "#/$defs/inner"
    assert not jsonschema_rs.validator_for(schema).is_valid({"k": "a"})
    assert schema_problem(schema) is not None or not _accepts(json_grammar(schema), '{"k": "a"}')


@pytest.mark.parametrize("discriminator", ["kind", {"propertyName": 5}, {"mapping": {}}])
def test_a_discriminator_in_any_form_is_dropped_as_the_size_check_counts_it(discriminator):
    """The size check counts no discriminator; one not as OpenAPI writes it was kept, and llguidance
    merged each ``$ref`` beside it with its definition: 100 uses of one 200-property definition
    passed the check, then the compile refused them ("initial lexer configuration too big")."""
    big = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(200)}}
    uses = {f"p{i}": {"$ref": "#/$defs/big", "discriminator": discriminator} for i in range(100)}
    schema = {"type": "object", "properties": uses, "$defs": {"big": big}}
    assert size_problem([schema], DEFAULTS) is None
    assert schema_problem(schema) is None
