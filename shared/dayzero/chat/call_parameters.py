"""A forced call's parameters schema: whether its grammar can hold it, and the definitions each
value's rule needs (chat.grammar's invoke rules)."""

from __future__ import annotations

from urllib.parse import unquote

from .dsml import to_json
from .schema_bounds import subschemas

# what a call's parameters may say: it writes only the declared properties, so no other can be
# missing (additionalProperties, unevaluatedProperties: any value holds), each value by its own rule
_PARAMETER_KEYS = {"type", "properties", "required", "additionalProperties", "unevaluatedProperties", "$defs"}
_PARAMETER_KEYS |= {"definitions", "description", "title", "$schema", "$id", "$comment", "strict", "default"}
_PARAMETER_KEYS |= {"examples"}


def parameters_problem(schema: dict) -> str | None:
    """What a forced call's grammar would drop (None: nothing), without compiling anything: a
    keyword on the parameters object itself it does not enforce (anyOf, minProperties,
    patternProperties, ...), a required name not among the properties (it could never be
    written), a type that is not an object."""
    kind = schema.get("type", "object")
    if unsupported := sorted(set(schema) - _PARAMETER_KEYS):
        return f"a call's parameters cannot be constrained by {', '.join(unsupported)}"
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        return f"a call's parameters are an object, not {to_json(kind)}"
    props = schema.get("properties") or {}
    if missing := [name for name in schema.get("required") or () if name not in props]:
        return f"required {to_json(missing)}: not among the properties, a call cannot write it"
    refs = refs_of({key: schema.get(key) for key in ("properties", "$defs", "definitions")})
    if outside := sorted(r for r in refs if not r.startswith(("#/$defs/", "#/definitions/"))):
        # each value's rule is its own schema (with the $defs): "#" would be the property, not these
        return f"a call's parameters may $ref only into $defs or definitions, not {to_json(outside)}"
    return None


def value_definitions(prop: object, parameters: dict) -> dict:
    """The definitions of a forced call's ``parameters`` that the property ``prop``'s value needs
    (where its $refs point, and theirs): its rule's JSON schema carries its own copy of them
    (compiled each time). Every definition in each rule made a tool of 1,000 properties and 1,000
    defined ones a grammar of 37 MB (871 MB, 3.1 s of the gateway's compile, then refused)."""
    needed: dict[str, dict] = {}
    refs = list(refs_of(prop))
    while refs:
        where, _, rest = refs.pop()[2:].partition("/")
        name = unquote(rest.split("/")[0]).replace("~1", "/").replace("~0", "~")
        held = parameters.get(where)
        if not isinstance(held, dict) or name not in held or name in needed.setdefault(where, {}):
            continue
        needed[where][name] = held[name]
        refs.extend(refs_of(held[name]))
    return {where: named for where, named in needed.items() if named}


def refs_of(schema: object) -> set[str]:
    """Every ``$ref`` in ``schema``."""
    return {node["$ref"] for node in subschemas(schema) if isinstance(node.get("$ref"), str)}
