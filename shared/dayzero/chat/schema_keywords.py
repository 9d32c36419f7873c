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
DATA = ("enum", "const", "default", "examples")  # values, not schemas: their keys bound nothing


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


def values_within(node: dict) -> Iterator[object]:
    """Every value of ``node`` but its ``DATA``'s, a map's schemas by value, a list's items (a
    property named "default" is no data): where an ``$id`` of its own lets a ``$ref`` point, its
    "#/x-big" within it and "https://x/inner#/x-big" anywhere (llguidance resolves a pointer against
    the nearest $id, which a walk reads all of, not each ``$ref`` against each $id: quadratic)."""
    for key, value in node.items():
        if key in MAPS and isinstance(value, dict):
            yield from value.values()
        elif isinstance(value, list) and key not in DATA:
            yield from value
        elif key not in DATA:
            yield value


def own_resource(node: object, root: object) -> bool:
    """Whether ``node``, within ``root``, holds an ``$id`` of its own (its data: ``values_within``)."""
    return node is not root and isinstance(node, dict) and isinstance(node.get("$id"), str)


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
