"""Regular expressions the walk of a schema's grammar (``grammar.schema_problem``) never reaches: an
optional property's, or an ``additionalProperties``' value, of an object open to other properties.
The walk writes the lowest byte each step allows, and there that is a key of its own ("  ..."),
written on to the walk's end: ``{"x": {"pattern": "^(a+){45}$"}}`` optional was let through, and
every reply that wrote "x" failed 4 bytes in ("too many expressions constructed"; as a required
property llguidance wrote ``(a+){50}`` whole). So each is walked to its first byte, where it stands
(``grammar.schema_problem``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from .grammar import _allowed, _byte_grammars, _walk_failed, json_grammar
from .schema_bounds import schemas_within
from .schema_merge import resolve
from .schema_names import MOST_PAIR_BYTES, pair_bytes
from .schema_size import _REGEX, open_object, written_literals
from .schema_splits import counts_unbounded_group

# patterns one schema's check walks at most (one grammar: ~0.05 s for 33, load 14; each compiled
# alone 0.3 s): past it, the schema is refused (the walk of its whole grammar reaches none of them:
# 64 such patterns before an optional ``(a+){50}`` let it through, every reply writing it failed)
MOST_WALKED = 64
_KEY_BYTES = 256  # bytes of a key walked for a patternProperties' name (the schema walk's own)


def unreached_problem(schema: object) -> str | None:
    """Why llguidance fails a reply at the first byte of a pattern of ``schema`` the walk of its
    grammar never reaches (``unreached_patterns``), walked where it stands (None: it does not), or
    that it holds more of them than are walked."""
    if len(patterns := tuple(unreached_patterns(schema))) > MOST_WALKED:
        what = "patterns repeating a group that repeats without bound (such as (a+){2})"
        return f"more than {MOST_WALKED} {what} in objects open to other properties: at most {MOST_WALKED} are checked"
    return _patterns_problem(patterns, _alphabet(schema) if patterns else "")


def _alphabet(schema: object) -> str:
    """The characters ``schema``'s property names and enum and const strings spell, each once: its
    grammar's lexer tells them apart, and a walked object holds them (a const string), so its lexer's
    alphabet is as large (beside an enum of 950 Cyrillic letters ``(a+){30}`` behind an open object's
    optional key was written whole in a walk of its own, and every reply failed there). Not its
    patterns' text: "^(a+){50}$" spells no "(" the lexer tells apart (the names walked: their own)."""
    nodes = (node for node in schemas_within(schema) if isinstance(node, dict))
    texts = (t for node in nodes for kind, ts in written_literals(node).items() if kind != _REGEX for t in ts)
    return "".join(sorted(set("".join(texts))))


class Unreached(NamedTuple):
    """A pattern the walk never reaches, and where it stands: a value of other properties
    (``additional``), of a patternProperties' name (``named``), else of an optional property."""

    pattern: str
    additional: bool = False
    named: str | None = None


def unreached_patterns(schema: object) -> Iterator[Unreached]:
    """The patterns of strings the walk of ``schema``'s grammar writes no byte of, each once where
    it stands and at most one past ``MOST_WALKED``, of those counting a group that repeats without
    bound (``(a+){n}``: what builds llguidance's lexer expressions past its fuel; ``(a|bb){300}``,
    ``(ab|c+){100}`` written whole)."""
    seen: set[Unreached] = set()
    for node in schemas_within(schema):
        if not isinstance(node, dict) or not open_object(node):
            continue
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = {r for r in node["required"] if isinstance(r, str)} if isinstance(node.get("required"), list) else ()
        named = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
        values = [(v, Unreached("")) for k, v in properties.items() if k not in required]
        values += [(v, Unreached("", named=k)) for k, v in named.items()]
        values.append((node.get("additionalProperties"), Unreached("", additional=True)))
        for value, where in values:
            for pattern in _patterns_in(schema, value):
                if (found := where._replace(pattern=pattern)) not in seen and counts_unbounded_group(pattern):
                    seen.add(found)
                    yield found
                    if len(seen) > MOST_WALKED:  # (one past: refused)
                        return


def _patterns_in(root: object, value: object) -> Iterator[str]:
    """The patterns of the strings ``value`` may be, or hold as an array's items or a union's
    branches (an optional property's ``[{"pattern": "^(a+){50}$"}]`` or anyOf of one failed as its
    own did, let through), however deep and however many $refs away (each subschema once: a $ref
    cycle ends; past 8 deep or 8 links one was never read, let through, and failed as its own did);
    not within an object's properties (each object is walked as its own)."""
    seen, nodes = set(), [value]
    while nodes:
        node = nodes.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(pattern := node.get("pattern"), str):
            yield pattern
        if isinstance(ref := node.get("$ref"), str):
            nodes.append(resolve(root, ref))
        for key in ("anyOf", "oneOf", "allOf", "prefixItems", "items"):
            within = node.get(key)
            nodes.extend(within if isinstance(within, list) else [within])


def _patterns_problem(patterns: tuple[Unreached, ...], alphabet: str) -> str | None:
    """Why llguidance fails a reply writing a string of one of ``patterns`` where it stands in an
    object open to other properties, when its first byte is to be written (None: it does not): each
    an optional property's or a patternProperties' (one grammar holds them all: one compile, 32
    compiled each took 0.15-0.3 s of CPU, load 14), or another property's value (each alone: nested
    in a property, it failed where the object's own did not)."""
    for schema, prefixes in _walks(patterns, alphabet):
        start = _byte_grammars().matcher(json_grammar(schema))
        for prefix, found in prefixes:
            if error := None if start.is_error() else _first_byte_error(start.deep_copy(), prefix):
                where = "a value of other properties" if found.additional else "an optional property"
                where += f" (of patternProperties' {found.named!r})" if found.named is not None else ""
                shown = found.pattern if len(found.pattern) <= 60 else found.pattern[:57] + "..."
                return f"the pattern {shown!r} of {where}: " + _walk_failed(error, first_step=False)
    return None


def _walks(patterns: tuple[Unreached, ...], alphabet: str = "") -> list[tuple[dict, list[tuple[str, Unreached]]]]:
    """The objects ``_patterns_problem`` walks, each with the prefixes leading to its patterns'
    first bytes: the optional properties' and patternProperties' values, in objects whose names
    llguidance's overlap check reads within ``MOST_PAIR_BYTES`` (64 objects of one long name each,
    walked as one object of 64: its compile the cost of one refused; each holds the names the others
    do as its values' patterns, no pair checked: its lexer's alphabet the schema's), and one each for the other
    properties'. A patternProperties' value is walked behind a key its name matches, where one
    is found (behind "x" ``(a+){40}`` was let through, failing every reply behind the key of
    ``^[a-z]{3,}_(foo|bar)$``), and as a property's too (behind ``^a{200}$``'s key alone ``(a+){42}``
    was let through, failing every reply where the object held another property: as a property's,
    refused)."""
    walks: list[tuple[dict, list[tuple[str, Unreached]]]] = []
    properties, named, prefixes = {}, {}, []
    for found in (found for found in patterns if not found.additional):
        value = {"type": "string", "pattern": found.pattern}
        if found.named is not None and found.named not in named and (key := _key_of(found.named)):
            if pair_bytes([*named, found.named]) > MOST_PAIR_BYTES:  # (the next object's)
                walks.append(({"type": "object", "properties": properties, "patternProperties": named}, prefixes))
                properties, named, prefixes = {}, {}, []
            named[found.named] = value
            prefixes.append((f'{{{key}: "', found))
        properties[name := f"x{len(properties)}"] = value
        prefixes.append((f'{{"{name}": "', found))
    walks.append(({"type": "object", "properties": properties, "patternProperties": named}, prefixes))
    if len(walks) > 1:  # (each holds the others' names as values' patterns: the schema's grammar tells
        # their bytes apart, and so its lexer's alphabet: behind a short name alone ``(a+){30}`` was written
        # whole in a walk, every reply failed in the schema beside 50 Cyrillic names in another object)
        names = [name for walk, _ in walks for name in walk["patternProperties"]]
        for walk, _ in walks:
            apart = (name for name in names if name not in walk["patternProperties"])
            walk["properties"] |= {f"y{i}": {"type": "string", "pattern": name} for i, name in enumerate(apart)}
    others = [found for found in patterns if found.additional]
    walks += [
        ({"type": "object", "additionalProperties": {"type": "string", "pattern": found.pattern}}, [('{"k": "', found)])
        for found in others
    ]
    for walk, _ in walks if alphabet else ():  # (the schema's alphabet: ``_alphabet``)
        walk["properties"] = walk.get("properties", {}) | {"~": {"const": alphabet}}
    return walks


def _key_of(name: str) -> str | None:
    """A key (a JSON string, as written) that the patternProperties' ``name`` matches: llguidance's
    walk of a string of that pattern, its lowest byte each step ('"' where it may end), within
    ``_KEY_BYTES`` (None: none)."""
    matcher, end = _byte_grammars().matcher(json_grammar({"type": "string", "pattern": name})), ord('"')
    written = bytearray()
    for _ in range(_KEY_BYTES):
        mask = matcher.compute_logit_bias()
        token = end if mask[end] == 200 else next(_allowed(mask, _byte_grammars().tokenizer.eos_token), None)
        if matcher.is_error() or token is None:
            return None
        matcher.consume_token(token)
        written.append(token)
        if len(written) > 1 and token == end:
            return written.decode("utf-8", "replace")
    return None


def _first_byte_error(matcher, prefix: str) -> str | None:
    """llguidance's error writing ``prefix`` and computing the mask after it (None: none)."""
    for byte in (*prefix.encode(), None):  # (each step's mask computed, as in decoding)
        matcher.compute_logit_bias()
        if byte is not None and not matcher.is_error():
            matcher.consume_token(byte)
        if matcher.is_error():
            return matcher.get_error()
    return None
