"""Schemas no finite JSON value satisfies: an object requiring a property whose schema requires the
object again (``{"$ref": "#/$defs/n"}``, n an object requiring "c", c n again). llguidance compiles
them and fails only where a reply reaches the recursion ("parser error: Too many items"; ~170 bytes
in behind 12 required booleans), so a walk of the grammar found it only within the bytes it walked:
128 forced tools are walked 64 bytes each (``tool_probe_steps``: their CPU), and one such tool among
them was let through to fail every reply. Found here without a walk, in the schema itself: the
least fixpoint of "some finite value satisfies it" over its subschemas, by rules weaker than JSON
schema's (what they do not read is taken as satisfiable), so a schema refused has no finite value."""

from __future__ import annotations

from .schema_bounds import schemas_within
from .schema_keywords import own_resource, values_within
from .schema_merge import resolve

_LEADS_BACK = "a required property, an item or a $ref leading back to it"


def endless_problem(schema: object) -> str | None:
    """Why no finite value satisfies ``schema`` (None: one may, as far as these rules read). Each
    subschema waits on what it needs (``_needed``) and on one branch of each of its unions; one
    whose waits are all met is satisfiable, and meets its dependents' (linear: Horn clauses)."""
    if not isinstance(schema, dict):
        return None
    nodes = list(schemas_within(schema))
    walked, elsewhere = {id(node) for node in nodes}, _within_resources(nodes, schema)
    waits: dict[int, int] = {}  # a subschema's conditions not met yet
    dependents: dict[int, list[tuple[int, object]]] = {}  # a subschema's -> (dependent, its need or union)
    for node in nodes:
        conditions = [{id(sub)} for sub in _needed(node, schema, id(node) not in elsewhere) if _walked(sub, walked)]
        unions = [
            union for union in _unions(node, schema, elsewhere) if union and all(_walked(s, walked) for s in union)
        ]
        conditions += [{id(sub) for sub in union} for union in unions]
        waits[id(node)] = len(conditions)
        for condition in conditions:
            for sub in condition:
                dependents.setdefault(sub, []).append((id(node), condition))
    ready, finite = [key for key, count in waits.items() if not count], set()
    while ready:
        key = ready.pop()
        finite.add(key)
        for dependent, condition in dependents.get(key, ()):
            if condition:  # (a condition met once: a union's other branches no more)
                condition.clear()
                waits[dependent] -= 1
                if not waits[dependent]:
                    ready.append(dependent)
    if id(schema) in finite:
        return None
    return f"it requires itself again without end ({_LEADS_BACK}): no finite value satisfies it"


def _walked(sub: object, walked: set[int]) -> bool:
    """Whether ``sub`` is a subschema waited on (True, False, a reference outside: satisfiable)."""
    return isinstance(sub, dict) and id(sub) in walked


def _within_resources(nodes: list[dict], root: dict) -> set[int]:
    """The ids of ``nodes`` within an ``$id`` of their own below ``root``: llguidance resolves their
    "#/..." $refs against it, not the document (read against the document, one pointing at its own
    {"type": "null"} was taken for the root's endless object of that name: a false refusal)."""
    inside: set[int] = set()
    for resource in (node for node in nodes if own_resource(node, root) and id(node) not in inside):
        stack: list[object] = [resource]
        while stack:
            if isinstance(sub := stack.pop(), dict) and id(sub) not in inside:
                inside.add(id(sub))
                stack.extend(values_within(sub))
            elif isinstance(sub, list):
                stack.extend(sub)
    return inside


def _needed(node: dict, root: dict, resolved: bool) -> list[object]:
    """The subschemas a value of ``node`` must satisfy, each: its $ref's (where ``resolved``: a
    pointer into ``root``), its allOf's, its required properties' or additional properties' (an
    object's only), its first minItems items' (an array's only)."""
    ref = node.get("$ref")
    needed = [resolve(root, ref)] if resolved and isinstance(ref, str) else []
    needed += node["allOf"] if isinstance(node.get("allOf"), list) else []
    kind = node.get("type") if node.get("nullable") is not True else None  # (OpenAPI's: null too)
    kind = kind[0] if isinstance(kind, list) and len(kind) == 1 else kind
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    # (a name no property nor pattern holds: additionalProperties' value, a $ref to its object
    # behind it failed every reply "Too many items" and was let through among 128 forced tools)
    others = None if node.get("patternProperties") else node.get("additionalProperties")
    if kind == "object" and isinstance(required := node.get("required"), list):
        needed += [properties.get(name, others) for name in required if isinstance(name, str)]
    least = node.get("minItems")
    if kind == "array" and isinstance(least, int) and not isinstance(least, bool) and least > 0:
        # (the items past a prefix shorter than minItems: ``items``' own, [{}] with minItems 2 and an
        # endless ``items`` was let through, every reply failed "Too many items" past its first item)
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        needed += prefix[:least] + ([node.get("items")] if len(prefix) < least else [])
    return needed


def _unions(node: dict, root: dict, elsewhere: set[int]) -> list[list]:
    """``node``'s anyOf and oneOf (a value satisfies one branch of each), less the branches its own
    ``type`` rules out (llguidance drops them: ``{"type": "object", "anyOf": [{"type": "null"}, n]}``
    is n's alone; read as satisfied by its null, one requiring itself failed every reply "Too many
    items"; a branch's $ref to a null's: its type read there, unless ``elsewhere``). A union left with
    none is left to llguidance ("Unsatisfiable schema")."""
    kinds = _kinds(node)
    unions = [union for key in ("anyOf", "oneOf") if isinstance(union := node.get(key), list) and union]
    return [[branch for branch in union if _meet(kinds, _branch_kinds(branch, root, elsewhere))] for union in unions]


def _branch_kinds(branch: object, root: dict, elsewhere: set[int]) -> set[str] | None:
    """The JSON types a union's ``branch`` allows: its own ``type``'s, else those at the end of its
    $ref's chain (each link read against ``root``: not ``elsewhere``, within an ``$id`` of its own;
    a ``$ref`` to a ``$ref`` to a null's, followed one step, was read as any type: a branch
    llguidance drops taken as satisfiable, every reply failing "Too many items")."""
    followed: set[int] = set()  # (a chain leading back to itself: any type)
    while isinstance(branch, dict) and id(branch) not in elsewhere and id(branch) not in followed:
        if {"type", "$id", "const", "enum"} & branch.keys() or not isinstance(ref := branch.get("$ref"), str):
            break
        followed.add(id(branch))
        branch = resolve(root, ref)
    return _kinds(branch) if isinstance(branch, dict) else None


def _kinds(node: dict) -> set[str] | None:
    """The JSON types ``node`` allows by its ``type`` (and OpenAPI's ``nullable``), else by its
    ``const`` or ``enum`` (``{"type": "object", "anyOf": [{"const": null}, n]}`` is n's alone to
    llguidance too); None: any."""
    kind = node.get("type")
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else None
    if kind is None and ("const" in node or isinstance(node.get("enum"), list)):
        kinds = {_kind_of(value) for value in ([node["const"]] if "const" in node else node["enum"])}
    if kinds is None or not all(isinstance(name, str) for name in kinds):
        return None
    return kinds | {"null"} if node.get("nullable") is True else kinds


def _kind_of(value: object) -> str | None:
    """The JSON type of a parsed JSON ``value`` (None: not one)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    kinds = ((int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))
    return next((name for cls, name in kinds if isinstance(value, cls)), None)


def _meet(kinds: set[str] | None, others: set[str] | None) -> bool:
    """Whether a value may be of both ``kinds`` and ``others`` (an integer is a number)."""
    if kinds is None or others is None or kinds & others:
        return True
    return "integer" in kinds and "number" in others or "number" in kinds and "integer" in others
