"""OpenAPI's ``discriminator`` (pydantic writes one beside each tagged union's ``oneOf``:
``Field(discriminator="kind")``) as llguidance is given it: dropped, in whatever form, for it only
names the property that tells the branches apart and validates nothing (JSON Schema has no such
keyword, and the size check counts none). Left in, llguidance took it for a constraint beside the
union: a copy of it in each branch, of each ``$ref``'s definition beside it (one kept as
``"discriminator": "kind"``: 100 uses of a 200-property definition passed the size check, then took
1-3 s of compile to be refused), and in a recursive model "circular references with sibling keys"
(every recursive tagged union refused).
A ``oneOf`` whose branches it does tell apart (each an object requiring the property, each with its
own string ``const`` there) is written as ``anyOf``: no value can match two branches, so both allow
the same (llguidance proves that only of branches written inline: pydantic's are ``$ref``s). A
``$ref`` is followed from the document's root only when no subschema below it has an ``$id``:
llguidance resolves one from the nearest ``$id``, which may name other, overlapping, branches."""

from __future__ import annotations

import json

from .schema_bounds import subschemas
from .schema_merge import resolve


def without_discriminators(schema: object) -> object:
    """``schema`` as llguidance compiles it: itself when no subschema has a ``discriminator``, else a
    copy without any (and each oneOf they tell apart an anyOf). (A ``dependentRequired`` or
    ``dependencies`` naming a property "discriminator" loses it: llguidance refuses both keywords.)"""
    if not any("discriminator" in node for node in subschemas(schema)):
        return schema
    copy = json.loads(json.dumps(schema))
    root = None if any("$id" in node for node in subschemas(copy) if node is not copy) else copy
    for node in subschemas(copy):  # (each node changed before the walk reads its subschemas)
        if "discriminator" not in node:
            continue
        name = _property_named(node)
        del node["discriminator"]
        if name is not None and "anyOf" not in node and _told_apart(root, node.get("oneOf"), name):
            node["anyOf"] = node.pop("oneOf")
    return copy


def _property_named(node: dict) -> str | None:
    """The property ``node``'s discriminator names (None: it names none, as OpenAPI writes one)."""
    found = node.get("discriminator")
    return found["propertyName"] if isinstance(found, dict) and isinstance(found.get("propertyName"), str) else None


def _told_apart(root: object, branches: object, name: str) -> bool:
    """Whether each of ``branches`` requires the property ``name`` of an object, each a different
    string (a branch with a ``$ref`` allows at most what its definition does: either proves it; its
    definition is looked up in ``root``, None: not at all)."""
    if not isinstance(branches, list) or not branches:
        return False
    tags = []
    for branch in branches:
        tag = _tag(branch, name)
        if tag is None and root is not None and isinstance(branch, dict) and isinstance(ref := branch.get("$ref"), str):
            tag = _tag(resolve(root, ref), name)
        tags.append(tag)
    return None not in tags and len(set(tags)) == len(tags)


def _tag(schema: object, name: str) -> str | None:
    """The one string an object ``schema`` requires its property ``name`` to be (None: none)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    required, properties = schema.get("required"), schema.get("properties")
    if not isinstance(required, list) or name not in required or not isinstance(properties, dict):
        return None
    prop = properties.get(name)
    if not isinstance(prop, dict):
        return None
    values = [prop["const"]] if "const" in prop else prop.get("enum")
    return values[0] if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) else None
