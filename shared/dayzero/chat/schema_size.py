"""How big a JSON schema (or a tool set's parameters) is, measured before anything compiles it:
llguidance's compile grows about quadratically in a schema's properties (8,000 optional ones:
~26 s of CPU, only to be refused by its lexer limit; bench/RESULTS.md), and a long enum costs
every decode step; and llguidance's parser holds so many items in one row, which an object of some
500 optional properties fills (found after its compile, or mid-reply: ``schema_rows``). Subschemas
are counted as llguidance builds them (``schema_merge``: the copies an allOf, a ``$ref`` or a union
with sibling keywords make), not as written. The gateway refuses a schema past these limits with
400 in milliseconds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .dsml import to_json
from .schema_alphabet import Alphabet
from .schema_counts import CountedChars, regexes
from .schema_keywords import LISTS, own_resource, schema_values, values_within, within_keywords
from .schema_merge import MOST_NESTED, Circular, Merged, TooBig, TooDeep, resolve
from .schema_names import names_problem
from .schema_rows import RowCheck

MOST_TOOLS = 1024  # tools a request may ever offer (the ceiling of DAYZERO_MAX_TOOLS)
# UTF-8 bytes of one string a grammar spells (a property name, an enum or const string: JSON-escaped,
# as a reply writes it) and of one regular expression's text. llguidance's lexer pays at each decode
# step for every byte of a literal still to write: one row's mask ~0.22 ms per 1,000 bytes at the
# built-in and at V4's vocabulary size alike (10,000 characters, the bound before: ~2.2 ms a step
# at its start, 10,000 CJK ones ~6 ms; 4,000 bytes ~0.9 ms; bench/literal_steps.py), and a whole
# reply grows quadratically in it. Far past it, a literal fails only where a reply reaches it (a
# name of 50,000 characters: the lexer's state limit; a const of ~103,000, a pattern of 7,000-9,000
# literal characters: "too many expressions"), a 400 after a 200 stream began
MOST_LITERAL_BYTES = 4_000
_REGEX = "a regular expression"


@dataclass(frozen=True)
class SchemaLimits:
    """The most a request's schemas may hold, together (settings: ``Settings.schema_limits``)."""

    nodes: int  # subschemas: each property's, item's, branch's, definition's ...
    literal_chars: int  # characters of enum and const values
    pattern_chars: int  # characters of regular expressions (pattern, patternProperties' names)


SETTINGS = {
    "nodes": "DAYZERO_GUIDED_MAX_SCHEMA_NODES",
    "literal_chars": "DAYZERO_GUIDED_MAX_LITERAL_CHARS",
    "pattern_chars": "DAYZERO_GUIDED_MAX_PATTERN_CHARS",
}
_WHAT = {
    "nodes": "subschemas (properties, items, branches, definitions)",
    "literal_chars": "characters of enum and const values",
    "pattern_chars": "characters of regular expressions (pattern, patternProperties)",
}


def size_problem(schemas: list, limits: SchemaLimits, calls: tuple[str, ...] = ()) -> str | None:
    """Why ``schemas`` (counted together: one grammar enforces them all) are too big to compile
    (None: they are not). Each subschema is counted as llguidance builds it (``schema_merge``): a
    plain ``$ref`` is not followed (its definition is counted where it stands), so a recursive
    schema costs its size, but one with sibling keywords, an allOf, a union with siblings are
    counted merged, each copy where it is made; the walk stops at the first limit passed (an enum
    of a million numbers is not read to its end). Nor may they hold an object, or a union of
    objects, past a row of llguidance's parser (``schema_rows``: there a union's ``$ref``'d
    branches are followed, each definition once). ``calls``: the names of the tools whose calls the
    grammar writes, ``schemas`` their parameters (their calls' grammar is no JSON object: bounded as
    one holding an open object, and a count after a repeat without bound by what that grammar
    writes, less: ``MOST_AFTER_UNBOUNDED_CALLS``)."""
    used, merged, counted = dict.fromkeys(SETTINGS, 0), Merged(limits.nodes), CountedChars()
    opened = bool(calls)  # whether the grammar holds an object open to other properties (its lexer holds less)

    def past(name: str, count: int) -> bool:
        used[name] += count
        return used[name] > getattr(limits, name)

    try:
        for node in _schema_nodes(schemas, merged):
            if past("nodes", 1 + _required_only(node)):
                return _message("nodes", limits)
            opened = opened or open_object(node)
            if not isinstance(node, dict):
                continue
            if any(past("literal_chars", _chars(value)) for value in _literals(node)):
                return _message("literal_chars", limits)
            if past("pattern_chars", _pattern_chars(node)):
                return _message("pattern_chars", limits)
            if problem := counted.problem(node) or _long_string(node):  # (a count names its own problem)
                return problem
            if problem := names_problem(node):
                return problem
        if opened and (problem := counted.open_problem(bool(calls))):
            return problem
        if problem := counted.wide_problem(lambda: byte_classes(schemas, limits, calls)):
            return problem
        for schema in schemas:  # within the limits: so many subschemas at most to look at again
            rows = RowCheck(schema, merged)  # its $refs point into it (a tool's: into its parameters)
            if problem := next(filter(None, map(rows.problem, _objects(schema, merged))), None):
                return problem
    except TooBig:
        return _message("nodes", limits)
    except Circular:
        return "a $ref with other keywords within the definition it refers to: circular references with sibling keys"
    except TooDeep:
        return f"allOf, or $ref / anyOf / oneOf with other keywords, merged within each other over {MOST_NESTED} deep"
    return None


def byte_classes(schemas: list, limits: SchemaLimits, calls: tuple[str, ...] = ()) -> int:
    """The byte classes the lexemes of the grammar enforcing ``schemas`` tell apart (``schema_alphabet``;
    ``calls``: the names of the tools whose calls it writes), its subschemas as llguidance builds
    them (within ``limits``)."""
    alphabet = Alphabet(calls)
    for node in _schema_nodes(schemas, Merged(limits.nodes)):
        if node is True:  # (any value)
            alphabet.add_node({}, [], opened=True)
        elif isinstance(node, dict):
            alphabet.add_node(node, regexes(node), open_object(node))
    return alphabet.classes()


def more_nodes_than(schemas: list, most: int) -> bool:
    """Whether ``schemas`` hold more than ``most`` subschemas (the walk stops there)."""
    return any(i >= most for i, _ in enumerate(_schema_nodes(schemas)))


def _message(name: str, limits: SchemaLimits) -> str:
    most = getattr(limits, name)
    return f"more than {most:,} {_WHAT[name]}: at most {SETTINGS[name]}={most} can be enforced"


def _schema_nodes(schemas: list, merged: Merged | None = None) -> Iterator[dict | bool]:
    """Every subschema of ``schemas``, depth first, without recursion (a deep schema costs no
    stack): as written, or as llguidance builds it when ``merged`` (each schema's ``$ref``s
    pointing into it). Only what schema keywords hold, what a ``$ref`` points at elsewhere
    (``_elsewhere``), and all but data within a definition of its own $id (``values_within``):
    values under enum, const, default, an example, an ``x-`` extension are the client's data, not
    schemas (an example holding ``{"minLength": 5000}`` was refused as one)."""
    for schema in schemas:
        if merged is not None:
            merged.within(schema)
        followed: set[int] = set()  # the definitions walked outside schema keywords (each once)
        # (a subschema, the copies it is in, whether within a resource of its own $id: its data read)
        stack: list[tuple[object, tuple | None, bool]] = [(schema, None, False)]
        while stack:
            written, copies, everything = stack.pop()
            node = written if merged is None else merged.merged(written)
            if node is not written:  # a merged copy: one within a copy of itself would never end
                copies = _copied(written, copies)
            yield node
            if not isinstance(node, dict):
                continue
            if merged is not None:  # (a copy's subschemas are walked in each copy: their items read again)
                merged.read(len(node) + sum(len(v) for k, v in node.items() if k in _READ and isinstance(v, list)))
            everything = everything or own_resource(written, schema)
            values = values_within(node) if everything else schema_values(node)
            stack.extend((v, copies, everything) for v in values if isinstance(v, dict | bool))
            if (target := _elsewhere(schema, node.get("$ref"))) is not None and id(target) not in followed:
                followed.add(id(target))
                stack.append((target, copies, everything))


_READ = (*LISTS, "required", "type")  # a node's lists a walk reads


def _elsewhere(root: object, ref: object) -> object:
    """The subschema ``ref`` points at when no schema keyword holds it (None: one does, or it is
    no JSON pointer): "#/x-defs/a", or a pointer after the root's $id ("https://x/s#/x-defs/a"),
    which llguidance compiles as a schema wherever it stands (a pointer after a definition's own
    $id: ``values_within``)."""
    if not isinstance(ref, str) or "#/" not in ref:
        return None
    pointer = "#" + ref.partition("#")[2]
    return None if within_keywords(root, pointer[1:]) else resolve(root, pointer)


def _copied(written: object, copies: tuple | None) -> tuple:
    """``copies`` (the merged copies a walk is in, innermost first: (subschema, outer ones)) and
    ``written``'s; ``Circular`` when it is in them already (a $ref with siblings within the definition
    it refers to: walked, its copy held itself without end; llguidance refuses it)."""
    outer = copies
    while outer is not None:
        if outer[0] is written:
            raise Circular
        outer = outer[1]
    return written, copies


def _objects(schema: object, merged: Merged) -> Iterator[dict]:
    return (node for node in _schema_nodes([schema], merged) if isinstance(node, dict))


def open_object(node: object) -> bool:
    """Whether ``node`` admits an object open to other properties (additionalProperties not false;
    ``true`` and ``{}``: any value, such an object too; an array of any items: such items). A $ref
    or union without a type is its subschemas' (each walked); an enum or const writes its values
    as they are."""
    if not isinstance(node, dict):
        return node is True
    if {"enum", "const"} & node.keys() or "type" not in node and {"$ref", "anyOf", "oneOf", "allOf"} & node.keys():
        return False
    kinds = node.get("type", "object")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "array" in kinds and node.get("items", True) is True:  # (items of any value: such objects too)
        return True
    return "object" in kinds and node.get("additionalProperties") is not False


def _required_only(node: object) -> int:
    """The names ``node`` requires that are not among its properties: llguidance builds each as a
    property of its own (its value any other property's), so each counts as a subschema (100,000 of
    them, ~1 MB, took 62 s of the gateway's compile before its lexer's limit refused them)."""
    if not isinstance(node, dict) or not isinstance(required := node.get("required"), list):
        return 0
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    return len({name for name in required if isinstance(name, str)} - properties.keys())


def _literals(node: dict) -> Iterator:
    enum = node.get("enum")
    yield from enum if isinstance(enum, list) else ()
    if "const" in node:
        yield node["const"]


def _long_string(node: dict) -> str | None:
    """A string of ``node`` one grammar lexeme spells past ``MOST_LITERAL_BYTES`` (None: none): any
    of ``written_literals``, or an enum or const value that is no string, written whole (its JSON
    text: strings each within the bound, an array or object of them spelled ~11-16 ms a step)."""
    lengths = {what: list(map(_json_utf8, strings)) for what, strings in written_literals(node).items()}
    lengths["a regular expression"] = list(map(_utf8, regexes(node)))
    lengths["an enum or const value (its JSON text)"] = [
        _utf8(to_json(v)) for v in _literals(node) if not isinstance(v, str)
    ]
    for what, written in lengths.items():
        if (longest := max(written, default=0)) > MOST_LITERAL_BYTES:
            most = MOST_LITERAL_BYTES
            return f"{what} of {longest:,} bytes (UTF-8, as written): at most {most:,} in one can be enforced"
    return None


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))  # (a lone surrogate is refused by grammar_problem)


def _json_utf8(text: str) -> int:
    """Bytes of ``text`` as a JSON string's inside (its quotes left out)."""
    return _utf8(to_json(text)) - 2


def written_literals(node: dict) -> dict[str, list[str]]:
    """The strings of ``node`` a reply writes as they are, by kind: its property and required names
    (a required one is written as a property), its enum and const strings (in an array or object
    value too, its keys as well), its regular expressions (a literal in one is forced as the same text)."""
    properties, required = node.get("properties"), node.get("required")
    return {
        "a property name": list(properties) if isinstance(properties, dict) else [],
        "a required name": [n for n in required if isinstance(n, str)] if isinstance(required, list) else [],
        "an enum or const string": list(_strings(list(_literals(node)))),
        _REGEX: regexes(node),
    }


def _strings(values: list) -> Iterator[str]:
    """The strings within ``values`` (JSON values), an object's keys too."""
    while values:
        value = values.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            yield from value
            values.extend(value.values())
        elif isinstance(value, list):
            values.extend(value)


def _chars(value: object) -> int:
    """``value``'s characters as a grammar spells it: a string's own (not its JSON escapes), else
    about its JSON text (Python's own spelling of it: as long but for escapes, and 10x quicker)."""
    return len(value) if isinstance(value, str) else len(str(value))


def _pattern_chars(node: dict) -> int:
    return sum(map(len, regexes(node)))
