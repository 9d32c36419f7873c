"""Regular expressions the walk of a schema's grammar (``grammar.schema_problem``) never reaches: an
optional property's, or an ``additionalProperties``' value, of an object open to other properties.
The walk writes the lowest byte each step allows, and there that is a key of its own ("  ..."),
written on to the walk's end: ``{"x": {"pattern": "^(a+){45}$"}}`` optional was let through, and
every reply that wrote "x" failed 4 bytes in ("too many expressions constructed"; as a required
property llguidance wrote ``(a+){50}`` whole). So each is walked to its first byte, where it stands
(``grammar.schema_problem``)."""

from __future__ import annotations

from collections.abc import Iterator

from .grammar import _byte_grammars, _walk_failed, json_grammar
from .schema_bounds import schemas_within
from .schema_merge import resolve
from .schema_size import open_object
from .schema_splits import counts_unbounded_group

# patterns one schema's check walks at most (one grammar: ~0.05 s for 33, load 14; each compiled
# alone 0.3 s): past it, the schema is refused (the walk of its whole grammar reaches none of them:
# 64 such patterns before an optional ``(a+){50}`` let it through, every reply writing it failed)
MOST_WALKED = 64


def unreached_problem(schema: object) -> str | None:
    """Why llguidance fails a reply at the first byte of a pattern of ``schema`` the walk of its
    grammar never reaches (``unreached_patterns``), walked where it stands (None: it does not), or
    that it holds more of them than are walked."""
    if len(patterns := tuple(unreached_patterns(schema))) > MOST_WALKED:
        what = "patterns repeating a group that repeats without bound (such as (a+){2})"
        return f"more than {MOST_WALKED} {what} in objects open to other properties: at most {MOST_WALKED} are checked"
    return _patterns_problem(patterns)


def unreached_patterns(schema: object) -> Iterator[tuple[str, bool]]:
    """The patterns of strings the walk of ``schema``'s grammar writes no byte of, each once and at
    most one past ``MOST_WALKED``: (the pattern, whether an additionalProperties' value, else an
    optional property's), of those counting a group that repeats without bound (``(a+){n}``: what
    builds llguidance's lexer expressions past its fuel; ``(a|bb){300}``, ``(ab|c+){100}`` written whole)."""
    seen: set[tuple[str, bool]] = set()
    for node in schemas_within(schema):
        if not isinstance(node, dict) or not open_object(node):
            continue
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = {r for r in node["required"] if isinstance(r, str)} if isinstance(node.get("required"), list) else ()
        named = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
        values = [(v, False) for k, v in properties.items() if k not in required] + [(v, False) for v in named.values()]
        values.append((node.get("additionalProperties"), True))
        for value, additional in values:
            for pattern in _patterns_in(schema, value):
                if (pattern, additional) not in seen and counts_unbounded_group(pattern):
                    seen.add((pattern, additional))
                    yield pattern, additional
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


def _patterns_problem(patterns: tuple[tuple[str, bool], ...]) -> str | None:
    """Why llguidance fails a reply writing a string of one of ``patterns`` where it stands in an
    object open to other properties, when its first byte is to be written (None: it does not): each
    an optional property's (one grammar holds them all: one compile, 32 compiled each took 0.15-0.3 s
    of CPU, load 14), or (its flag) another property's value (each alone: nested in a property, it
    failed where the object's own did not)."""
    optional = [pattern for pattern, additional in patterns if not additional]
    properties = {f"x{i}": {"type": "string", "pattern": pattern} for i, pattern in enumerate(optional)}
    walks = [
        ({"type": "object", "properties": properties}, [(f'{{"x{i}": "', p, False) for i, p in enumerate(optional)])
    ]
    walks += [
        ({"type": "object", "additionalProperties": {"type": "string", "pattern": p}}, [('{"k": "', p, True)])
        for p, additional in patterns
        if additional
    ]
    for schema, prefixes in walks:
        start = _byte_grammars().matcher(json_grammar(schema))
        for prefix, pattern, additional in prefixes:
            if error := None if start.is_error() else _first_byte_error(start.deep_copy(), prefix):
                where = "a value of other properties" if additional else "an optional property (or patternProperties')"
                shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
                return f"the pattern {shown!r} of {where}: " + _walk_failed(error, first_step=False)
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
