"""Regular expressions the walk of a schema's grammar (``grammar.schema_problem``) never reaches: an
optional property's, or an ``additionalProperties``' value, of an object open to other properties.
The walk writes the lowest byte each step allows, and there that is a key of its own ("  ..."),
written on to the walk's end: ``{"x": {"pattern": "^(a+){45}$"}}`` optional was let through, and
every reply that wrote "x" failed 4 bytes in ("too many expressions constructed"; as a required
property llguidance wrote ``(a+){50}`` whole). So each is walked alone, where it stands."""

from __future__ import annotations

from collections.abc import Iterator

from .schema_bounds import schemas_within
from .schema_merge import resolve
from .schema_size import open_object
from .schema_splits import split_ways

# regular expressions one schema's check walks alone at most (~5-20 ms each, cached by their text):
# past it, the rest are left to the walk of the whole grammar
MOST_WALKED_ALONE = 32
_MOST_LINKS = 8  # $refs followed to a property's schema


def unreached_patterns(schema: object) -> Iterator[tuple[str, bool]]:
    """The patterns of strings the walk of ``schema``'s grammar writes no byte of, each once and at
    most ``MOST_WALKED_ALONE``: (the pattern, whether an additionalProperties' value, else an
    optional property's), of those repeating a counted group of varying length (``split_ways``: what
    builds llguidance's lexer expressions without end, ``(a+){n}``)."""
    seen: set[tuple[str, bool]] = set()
    for node in schemas_within(schema):
        if not isinstance(node, dict) or not open_object(node):
            continue
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = set(node.get("required") or ()) if isinstance(node.get("required"), list) else set()
        values = [(v, False) for k, v in properties.items() if k not in required]
        values.append((node.get("additionalProperties"), True))
        for value, additional in values:
            pattern = _followed(schema, value).get("pattern") if isinstance(value, dict) else None
            if isinstance(pattern, str) and (pattern, additional) not in seen and split_ways(pattern):
                seen.add((pattern, additional))
                yield pattern, additional
                if len(seen) >= MOST_WALKED_ALONE:
                    return


def _followed(root: object, value: dict) -> dict:
    """``value``, or the schema its $ref chain ends at (a few links)."""
    for _ in range(_MOST_LINKS):
        if not isinstance(ref := value.get("$ref"), str) or not isinstance(target := resolve(root, ref), dict):
            break
        value = target
    return value
