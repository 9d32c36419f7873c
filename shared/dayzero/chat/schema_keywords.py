"""Where a JSON schema holds schemas: the keywords whose value is a schema, a list of them, or a
map of names to them. What else a schema holds is the client's data (enum, const, default, an
OpenAPI ``example``, an ``x-`` extension, a discriminator's mapping): llguidance compiles none of it,
unless a ``$ref`` points into it (it follows a JSON pointer anywhere in the document)."""

from __future__ import annotations

from collections.abc import Iterator

from .schema_merge import list_item, pointer_parts

MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_NAMED = (*MAPS, "dependencies")  # (a dependencies value may be a list of names: no schema)
_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "contains")
_ONE += ("not", "if", "then", "else", "propertyNames", "contentSchema")
LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def schema_values(node: dict) -> Iterator[object]:
    """The values ``node``'s schema keywords hold as schemas (a dependencies' list of names too:
    no schema, the caller's to skip)."""
    for key, value in node.items():
        if key in _NAMED and isinstance(value, dict):
            yield from value.values()
        elif key in LISTS and isinstance(value, list):
            yield from value
        elif key in _ONE:
            yield value


def within_keywords(root: object, pointer: str) -> bool:
    """Whether the JSON pointer ``pointer`` ("/properties/a/items", a ``$ref``'s after its "#") leads
    from ``root`` through schema keywords only (where a walk of its subschemas finds it anyway)."""
    node, parts = root, pointer_parts(pointer)
    while parts and isinstance(node, dict):
        key = parts.pop(0)
        value = node.get(key)
        if key in _NAMED and isinstance(value, dict) and parts:
            node = value.get(parts.pop(0))
        elif key in LISTS and isinstance(value, list) and parts:
            node = list_item(value, parts.pop(0))
        elif key in _ONE:
            node = value
        else:
            return False
    return not parts
