"""The numbers of a JSON schema llguidance cannot take (it clamps integers into int64, and some near
-2^63 crash its process), found before anything compiles it; and the walks over a schema's
subschemas the grammar's checks (every object, to be safe) and its rewrites (only the schemas) share."""

from __future__ import annotations

from collections.abc import Iterator

from .schema_keywords import own_resource, schema_values, values_within
from .schema_merge import ANNOTATIONS, resolve

_I64 = 2**63


def bound_problem(schema: object) -> str | None:
    """A bound llguidance cannot take (it clamps an integer's bounds into int64): a lower bound past
    2^63 - 2 (``exclusiveMinimum`` 1e20 with ``maximum`` 1e21 let 2^63 - 1 through), or any bound
    within 2^32 of -2^63 (``minimum`` -2^63 + 1 with ``maximum`` -2^63 + 5 crashed the process), and
    so an integer of a const or enum value (``const`` -2^63 + 100, alone or in an object or array,
    crashed it: its bounds both). Only what llguidance compiles is read (``schemas_within``: not a
    client's ``example`` or ``x-`` data, unless a ``$ref`` points there)."""
    for node in schemas_within(schema):
        for key, value in node.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            bound = number and key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
            if bound and (value <= 2**32 - _I64 or key.endswith("inimum") and value >= _I64 - 1):
                return f"{key} {value} is past the 64-bit range of numbers that can be enforced"
        if (value := _lowest_literal(node)) is not None:
            return f"the const or enum value {value} is past the 64-bit range of numbers that can be enforced"
    return None


def _lowest_literal(node: dict) -> int | None:
    """An integer within 2^32 of -2^63 among ``node``'s const and enum values, their arrays' and
    objects' too (None: none)."""
    values = [node["const"]] if "const" in node else []
    values += node["enum"] if isinstance(node.get("enum"), list) else []
    while values:
        value = values.pop()
        if isinstance(value, int) and not isinstance(value, bool) and value <= 2**32 - _I64:
            return value
        values.extend(value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())
    return None


def subschemas(schema: object) -> Iterator[dict]:
    """Every object in ``schema``, itself included (values under enum, const, ... are data: skipped;
    a map's schemas by value: a property named "default" is no data, its $refs are needed)."""
    nodes = [schema]
    while nodes:
        node = nodes.pop()
        if isinstance(node, list):
            nodes.extend(node)
        elif isinstance(node, dict):
            yield node
            nodes.extend(values_within(node))


def schemas_within(schema: object) -> Iterator[dict]:
    """``schema`` and its subschemas as a schema keyword holds them (properties' values, items,
    anyOf's branches, ...), and those its "#/..." $refs point at (llguidance follows a JSON pointer
    anywhere in the document: "#/components/schemas/X"), each once; not the client's data under
    other keys (enum, const, dependentRequired, a discriminator's mapping, an extension's x-...)."""
    seen, nodes, everything = set(), [schema], set()  # everything: ids of nodes within an $id's resource
    while nodes:
        node = nodes.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node  # (before its subschemas are read: a rewrite of it is walked)
        within = id(node) in everything or own_resource(node, schema)
        children = list(values_within(node) if within else schema_values(node))
        everything.update(id(child) for child in children if within)
        nodes.extend(children)
        if isinstance(ref := node.get("$ref"), str) and "#/" in ref:  # (after the root's $id too: "https://x/s#/x-a")
            nodes.append(resolve(schema, "#" + ref.partition("#")[2]))


def merged_groups(schema: object) -> list[list[dict]]:
    """``schema``'s subschemas (``schemas_within``) in groups llguidance merges into one schema
    each: an allOf with its members, a $ref or a union with sibling keywords and its definition or
    branches (a minLength in one, a maxLength in another bound one string)."""
    nodes = list(schemas_within(schema))
    parent = {id(node): id(node) for node in nodes}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = key = parent[parent[key]]
        return key

    def join(node: dict, other: object) -> None:
        if isinstance(other, dict) and id(other) in parent:
            parent[root(id(other))] = root(id(node))

    for node in nodes:
        for member in node.get("allOf") if isinstance(node.get("allOf"), list) else ():
            join(node, member)
        if any(key not in ANNOTATIONS and key not in ("$ref", "anyOf", "oneOf") for key in node):
            if isinstance(ref := node.get("$ref"), str):
                join(node, resolve(schema, ref))
            for key in ("anyOf", "oneOf"):
                for branch in node.get(key) if isinstance(node.get(key), list) else ():
                    join(node, branch)
    groups: dict[int, list[dict]] = {}
    for node in nodes:
        groups.setdefault(root(id(node)), []).append(node)
    return list(groups.values())
