"""How big a JSON schema (or a tool set's parameters) is, measured before anything compiles it:
llguidance's compile grows about quadratically in a schema's properties (8,000 optional ones:
~26 s of CPU, only to be refused by its lexer limit; bench/RESULTS.md), and a long enum costs
every decode step; and llguidance's parser holds at most ``ROW_ITEMS`` items in one row, which an object
of some 500 optional properties fills (found only after its compile). The gateway refuses a schema
past these limits with 400 in milliseconds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_DATA = ("enum", "const", "default", "examples")  # values, not schemas
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
MOST_TOOLS = 1024  # tools a request may ever offer (the ceiling of DAYZERO_MAX_TOOLS)
ROW_ITEMS = 2000  # llguidance's max_items_in_row (its default; chat.grammar.parser_limits passes it)
# The rows of llguidance's parser an object's optional properties (not in required) fill (measured,
# llguidance 1.x). With no required property: one row, 4 items each, plus 7 (open: any other property
# may follow) or less 1 (additionalProperties false): 498 / 500 at most. With one: the optional
# properties declared before the first required one, 3 items each plus 1 (666 at most); then those
# after each required one, 2 items each plus 1, and 2 more when some come before the first required
# one; after the last, plus 3 when open, and those before the first and 3 when there are some (998
# at most after a required one first: llguidance took the object of 1,000 after it, which the first
# steps' check let through, and failed each reply mid-way)
_OPEN_ROW, _CLOSED_ROW = 7, -1


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


def size_problem(schemas: list, limits: SchemaLimits) -> str | None:
    """Why ``schemas`` (counted together: one grammar enforces them all) are too big to compile
    (None: they are not). Each subschema is counted once as written: a ``$ref`` is not followed
    (its definition is counted where it stands), so a recursive schema costs its size, and the walk
    stops at the first limit passed (an enum of a million numbers is not read to its end). Nor may
    they hold an object of more optional properties than llguidance's parser takes."""
    used = dict.fromkeys(SETTINGS, 0)

    def past(name: str, count: int) -> bool:
        used[name] += count
        return used[name] > getattr(limits, name)

    optional = None  # the first object past the parser's row (named once the sizes are within their limits)
    for node in _schema_nodes(schemas):
        if past("nodes", 1):
            return _message("nodes", limits)
        if not isinstance(node, dict):
            continue
        if any(past("literal_chars", _chars(value)) for value in _literals(node)):
            return _message("literal_chars", limits)
        if past("pattern_chars", _pattern_chars(node)):
            return _message("pattern_chars", limits)
        if optional is None:
            optional = _optional_problem(node)
    return optional


def _optional_problem(node: dict) -> str | None:
    """Why llguidance's parser cannot take ``node`` (None: it can): an object whose optional
    properties fill a row of its parser past what it holds, or an anyOf / oneOf whose objects,
    opening in one row, hold more together."""
    if (row := _widest_row(node)) is not None and row[0] > ROW_ITEMS:
        return row[1]
    branches = [b for key in ("anyOf", "oneOf") if isinstance(node.get(key), list) for b in node[key]]
    if (items := sum(_opening_row(b) for b in branches)) > ROW_ITEMS:
        optional = sum(_runs(b)[0] for b in branches if _runs(b))
        return (
            f"the objects of one anyOf / oneOf hold {optional:,} optional properties that may come first (none "
            f"required, or declared before the first required one) together: llguidance's parser offers them all "
            f"in one row, {items:,} items of its {ROW_ITEMS:,}"
        )
    return None


def _runs(node: object) -> list[int]:
    """The object ``node``'s optional properties in runs, as declared: [all of them] when none is
    required; else [those before the first required one, those after it up to the next, ..., those
    after the last]. Empty: not an object of properties."""
    properties = node.get("properties") if isinstance(node, dict) else None
    if not isinstance(properties, dict):
        return []
    required = node.get("required")
    named = {r for r in required if isinstance(r, str)} & properties.keys() if isinstance(required, list) else set()
    runs = [0]
    for name in properties:
        if name in named:
            runs.append(0)
        else:
            runs[-1] += 1
    return runs


def _opening_row(node: object) -> int:
    """The items of llguidance's parser row where the object ``node`` opens, of its properties (an
    object with no ``properties`` counts nothing: an undercount, which the compile's check backs)."""
    runs = _runs(node)
    if len(runs) == 1:  # none required (none at all: 7 items open, 1 closed)
        return max(1, 4 * runs[0] + (_CLOSED_ROW if node.get("additionalProperties") is False else _OPEN_ROW))
    return 3 * runs[0] + 1 if runs else 0


def _widest_row(node: object) -> tuple[int, str] | None:
    """The row of llguidance's parser that the object ``node``'s optional properties fill most: (its
    items, the refusal were it past the row's). None: no optional property."""
    runs = _runs(node)
    if not any(runs):
        return None
    closed = node.get("additionalProperties") is False
    if len(runs) == 1:
        most = (ROW_ITEMS - (_CLOSED_ROW if closed else _OPEN_ROW)) // 4
        kind = "with additionalProperties false" if closed else "open to other properties"
        return _opening_row(node), (
            f"an object of {runs[0]:,} optional properties (not in required): at most {most} in one object "
            f"{kind} can be enforced (llguidance's parser holds {ROW_ITEMS:,} items in a row, 4 per optional property)"
        )
    rows = [(_opening_row(node), runs[0], (ROW_ITEMS - 1) // 3, "declared before its first required one")]
    for i, run in enumerate(runs[1:], 1):
        if i == len(runs) - 1:  # after the last required one
            end = (1 if closed else 3) + (runs[0] + 3 if runs[0] else 0)
        else:
            end = 1 + (2 if runs[0] else 0)
        rows.append((2 * run + end, run, (ROW_ITEMS - end) // 2, "declared after a required one"))
    items, optional, most, where = max(rows)
    return items, (
        f"an object of {optional:,} optional properties {where} in a row: at most {most} can be enforced "
        f"(llguidance's parser offers them in one row, which holds {ROW_ITEMS:,} items)"
    )


def more_nodes_than(schemas: list, most: int) -> bool:
    """Whether ``schemas`` hold more than ``most`` subschemas (the walk stops there)."""
    return any(i >= most for i, _ in enumerate(_schema_nodes(schemas)))


def _message(name: str, limits: SchemaLimits) -> str:
    most = getattr(limits, name)
    return f"more than {most:,} {_WHAT[name]}: at most {SETTINGS[name]}={most} can be enforced"


def _schema_nodes(schemas: list) -> Iterator[dict | bool]:
    """Every subschema of ``schemas`` as written, depth first, without recursion (a deep schema
    costs no stack); values under enum, const, default, examples are data, not schemas."""
    stack = list(reversed(schemas))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _DATA:
                continue
            if key in _MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif isinstance(value, dict):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, dict | bool))


def _literals(node: dict) -> Iterator:
    enum = node.get("enum")
    yield from enum if isinstance(enum, list) else ()
    if "const" in node:
        yield node["const"]


def _chars(value: object) -> int:
    """``value``'s characters as a grammar spells it: a string's own (not its JSON escapes), else
    about its JSON text (Python's own spelling of it: as long but for escapes, and 10x quicker)."""
    return len(value) if isinstance(value, str) else len(str(value))


def _pattern_chars(node: dict) -> int:
    pattern, named = node.get("pattern"), node.get("patternProperties")
    return (len(pattern) if isinstance(pattern, str) else 0) + (sum(map(len, named)) if isinstance(named, dict) else 0)
