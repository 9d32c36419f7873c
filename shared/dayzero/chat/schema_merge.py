"""A JSON schema's subschemas as llguidance's JSON compiler builds them (1.x), one level at a time:
an allOf's members are intersected into one schema, and so are a ``$ref``, anyOf or oneOf and
their sibling keywords: a ``$ref`` with siblings is a copy of its definition merged with them, and
a union with siblings copies them into each branch (an allOf of unions: every combination of their
branches). Each copy is compiled on its own: counted as written, 20 such ``$ref``s to a
definition of 490 properties were 512 subschemas where llguidance built 9,800 properties, and the
object an allOf or a ``$ref`` with siblings merges filled a row of its parser that no written
object did (every reply failed there, mid-way). A plain ``$ref`` stays one (llguidance compiles
its definition once)."""

from __future__ import annotations

from urllib.parse import unquote

# keywords that enforce nothing (llguidance's META_AND_ANNOTATIONS, and OpenAPI's discriminator, dropped
# before it compiles: schema_discriminator): siblings of only these leave a $ref or a union as it is
ANNOTATIONS = frozenset(
    ("$anchor", "$defs", "definitions", "$schema", "$id", "id", "$comment", "title", "description", "default")
) | frozenset(("readOnly", "writeOnly", "examples", "contentMediaType", "contentEncoding", "discriminator"))
_UNIONS = ("anyOf", "oneOf")
_DEFINITIONS = ("$defs", "definitions")
_SCHEMAS = ("items", "additionalItems", "contains", "propertyNames")  # one subschema each
MOST_NESTED = 100  # merges within merges (an allOf in an allOf's member, ...): deeper is refused
# items a check may read per subschema it allows (keywords, required names, prefixItems, a merge's and
# the walk's): copies share what they copy, so 1,500 merges of one definition of 10,000 prefixItems
# read 15 million (30 s of the gateway's CPU for a 40 kB schema); a schema in use reads ~10 a node
MOST_READ_PER_NODE = 100


class TooBig(Exception):
    """Merging the schema took more than its bound of intersections (the walk's limit)."""


class Circular(Exception):
    """A merged copy within a copy of itself (``schema_size``'s walk finds it)."""


class TooDeep(Exception):
    """Merges nested past ``MOST_NESTED`` (each a few frames of Python's stack)."""


class Merged:
    """The subschemas of schemas as llguidance merges them, each merged once (``merged``) and kept
    (their ids stay theirs while this lives). ``most`` bounds the intersections, all together: an
    allOf of 6 unions of 6 branches is 46,656 merged schemas, refused past it (``TooBig``); and the
    items read, ``MOST_READ_PER_NODE`` times it (``read``)."""

    def __init__(self, most: int) -> None:
        self._left, self._unread = most, most * MOST_READ_PER_NODE
        self._merged: dict[tuple[int, int], tuple[object, object]] = {}  # (root's, node's id) -> (node, merged)
        self._root: object = None
        self._resolving: set[int] = set()  # definitions being merged into a $ref's siblings (a cycle: left)
        self._depth = 0  # merges within merges now

    def within(self, root: object) -> Merged:
        """This, resolving ``$ref``s in ``root`` (the schema they point into) from now."""
        self._root = root
        return self

    def merged(self, node: object) -> object:
        """``node`` as llguidance compiles it (itself when nothing merges): one level, its
        subschemas as they are (each merged when it is reached)."""
        if not isinstance(node, dict):
            return node
        key = (id(self._root), id(node))
        if (known := self._merged.get(key)) is None:
            self._merged[key] = known = (node, self._merge(node))
        return known[1]

    def _merge(self, node: dict) -> object:
        """``node`` merged; its definitions kept where they stand (counted once, copied nowhere)."""
        merged = self._intersected(node)
        if merged is node or not isinstance(merged, dict):
            return merged
        return merged | {key: node[key] for key in _DEFINITIONS if key in node}

    def _intersected(self, node: dict) -> object:
        if isinstance(members := node.get("allOf"), list):
            merged: object = _without(node, "allOf")
            for member in members:
                merged = self._intersect(merged, member)
            return merged
        for union in _UNIONS:
            if isinstance(branches := node.get(union), list) and _constrains(rest := _without(node, union)):
                return {union: [self._intersect(rest, branch) for branch in branches]}
        if isinstance(ref := node.get("$ref"), str) and _constrains(rest := _without(node, "$ref")):
            return self._intersect({"$ref": ref}, rest)
        return node

    def _intersect(self, a: object, b: object) -> object:
        """What both ``a`` and ``b`` allow, as llguidance builds it: a union's branches each
        intersected, a ``$ref``'s definition copied, two objects' properties merged (every merge
        within another goes through here: bounded by ``MOST_NESTED``)."""
        self._depth += 1
        try:
            if self._depth > MOST_NESTED:
                raise TooDeep
            return self._intersection(a, b)
        finally:
            self._depth -= 1

    def _intersection(self, a: object, b: object) -> object:
        a, b = self.merged(a), self.merged(b)
        if a is True or isinstance(a, dict) and not _constrains(a) or b is False:
            return b
        if b is True or isinstance(b, dict) and not _constrains(b) or a is False or not isinstance(a, dict):
            return a
        if not isinstance(b, dict):
            return a
        self._spend(1)
        for one, other in ((a, b), (b, a)):
            union = next((u for u in _UNIONS if isinstance(one.get(u), list)), None)
            if union is not None:
                self._spend(len(one[union]))
                return {union: [self._intersect(branch, other) for branch in one[union]]}
        for one, other in ((a, b), (b, a)):
            if isinstance(ref := one.get("$ref"), str):
                target = resolve(self._root, ref)
                if not isinstance(target, dict) or id(target) in self._resolving:
                    return other  # outside the schema or a cycle: llguidance refuses it itself
                self._resolving.add(id(target))
                try:
                    return self._intersect(target, other)
                finally:
                    self._resolving.discard(id(target))
        return self._objects(a, b)

    def _objects(self, a: dict, b: dict) -> dict:
        """``a`` and ``b`` as one schema: their properties merged (those of one only also taking the
        other's additionalProperties, as llguidance does), required ones together, subschemas of both
        as an allOf."""
        self.read(len(a) + len(b))
        merged = {k: v for k, v in (a | b).items() if k not in _DEFINITIONS}
        for key in ("properties", "patternProperties"):
            ours, theirs = a.get(key), b.get(key)
            if isinstance(ours, dict) and isinstance(theirs, dict):
                self._spend(len(ours) + len(theirs))
                extra, more = a.get("additionalProperties"), b.get("additionalProperties")
                mine = {n: _both(s, theirs.get(n, more)) for n, s in ours.items()}  # (in order)
                merged[key] = mine | {n: _both(s, extra) for n, s in theirs.items() if n not in ours}
        for key in ("additionalProperties", *_SCHEMAS):
            if key in a and key in b:
                merged[key] = False if a[key] is False or b[key] is False else _both(a[key], b[key])
        required = [*_names(a.get("required")), *_names(b.get("required"))]
        self.read(len(required))
        if required:
            merged["required"] = list(dict.fromkeys(required))
        if isinstance(first := a.get("prefixItems"), list) and isinstance(second := b.get("prefixItems"), list):
            self.read(len(first) + len(second))
            merged["prefixItems"] = [_both(x, y) for x, y in zip(first, second, strict=False)]
            merged["prefixItems"] += (first if len(first) > len(second) else second)[len(merged["prefixItems"]) :]
        return merged

    def _spend(self, count: int) -> None:
        self._left -= count
        if self._left < 0:
            raise TooBig

    def read(self, count: int) -> None:
        """Counts ``count`` items read: past the bound, ``TooBig``."""
        self._unread -= count
        if self._unread < 0:
            raise TooBig


def _both(a: object, b: object) -> object:
    """A subschema allowing what both do (merged once reached); ``b`` None: ``a`` alone."""
    return a if b is None or b is True else {"allOf": [a, b]}


def _names(required: object) -> list[str]:
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def _without(node: dict, key: str) -> dict:
    return {k: v for k, v in node.items() if k != key}


def _constrains(node: dict) -> bool:
    """Whether ``node`` enforces anything (keywords but annotations)."""
    return any(key not in ANNOTATIONS for key in node)


def resolve(root: object, ref: str) -> object:
    """The subschema a local ``$ref`` ("#", "#/$defs/name", any JSON pointer) points at (None: none,
    or a reference outside the schema, which llguidance refuses itself)."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = root
    for part in pointer_parts(ref[1:]):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list):
            node = list_item(node, part)
        else:
            return None
    return node


def list_item(values: list, part: str) -> object:
    """The item of ``values`` a JSON pointer's ``part`` indexes (None: none; a part of 5,000 digits
    was a ValueError past Python's int limit: a 500)."""
    index = int(part) if part.isascii() and part.isdigit() and len(part) <= len(str(len(values))) else len(values)
    return values[index] if index < len(values) else None


def pointer_parts(pointer: str) -> list[str]:
    """The keys and indexes of the JSON pointer ``pointer`` ("" or "/a/b"), unescaped."""
    return [unquote(part).replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:]]
