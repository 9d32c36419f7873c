"""OpenAPI's dialect of JSON schema as llguidance is given it. ``nullable: true`` (OpenAPI 3.0, what
many clients' generators write for an optional field) adds "null" to the node's ``type`` (as 3.0.3
reads it: only where a type is given, and an ``enum`` still has to list null): llguidance ignored
it, and a nullable field refused null. A ``format`` llguidance does not know (OpenAPI's int32,
int64, byte, password, JSON schema's uri-reference, ...) is dropped, as JSON schema has validators
treat one (an annotation): llguidance refused the whole schema ("Unknown format"). OpenAI documents
nine formats; those, and uri, it still enforces. The ``maxLength``s past what llguidance's lexer
holds together (``length_cap``: one of 30,000 failed a reply at ~10 KB, two of 4,000 and 3,999 at
~5,560 bytes) are clamped to a cap: a reply within it still satisfies the client's schema."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from types import EllipsisType

from .schema_bounds import merged_groups, schemas_within
from .schema_counts import as_number, group_floor, length_cap

log = logging.getLogger("dayzero.gateway")

# the string formats llguidance enforces (its others are refused, unknown)
KNOWN_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"})
MOST_WARNED = 64  # unknown formats warned about, once each, in a process's life
_WARNED: set[str] = set()


def grammar_cap(schemas: Iterable[object]) -> int | None:
    """``length_cap`` of the schemas one grammar enforces together (a call's tools: one lexer's
    states), read once for the grammar: read again for each tool, 128 forced tools read 16,384."""
    return length_cap(group for schema in schemas for group in merged_groups(schema))


def as_llguidance(schema: object, cap: int | None | EllipsisType = ...) -> object:
    """``schema`` as llguidance compiles it: itself when it has no ``nullable`` and no format
    llguidance does not know and its maxLengths fit the lexer together (``cap``: its grammar's,
    ``grammar_cap`` of a call's tools; by default its own), else a copy with each nullable type a
    union with "null", each such format dropped and each maxLength over the cap cut to it (its
    group's floor at the least: ``group_floor``)."""
    cap = grammar_cap([schema]) if cap is ... else cap
    if cap is None and not any(_openapi(node) for node in schemas_within(schema)):
        return schema
    copy = json.loads(json.dumps(schema))
    floors = (
        {id(node): group_floor(group) for group in merged_groups(copy) for node in group} if cap is not None else {}
    )
    for node in schemas_within(copy):  # (each node changed before the walk reads its subschemas)
        if node.pop("nullable", False) is True and isinstance(kind := node.get("type"), str | list):
            node["type"] = (
                [kind, "null"] if isinstance(kind, str) else [*kind, *(["null"] if "null" not in kind else [])]
            )
        if isinstance(node.get("format"), str) and node["format"] not in KNOWN_FORMATS:
            _ignored(node.pop("format")[:64])
        if cap is not None and (as_number(node.get("maxLength")) or 0) > cap:
            node["maxLength"] = max(cap, floors[id(node)])
    return copy


def _openapi(node: dict) -> bool:
    written = node.get("format")
    return "nullable" in node or isinstance(written, str) and written not in KNOWN_FORMATS


def _ignored(format_: str) -> None:
    """A warning once per format, for the first ``MOST_WARNED`` formats only (a client can send
    schemas at will, each naming formats of its own: no log line per request)."""
    if format_ in _WARNED or len(_WARNED) >= MOST_WARNED:
        return
    _WARNED.add(format_)
    later = "; later unknown formats go unlogged" if len(_WARNED) == MOST_WARNED else ""
    log.warning("format %r is not enforced (llguidance does not know it): ignored, as an annotation%s", format_, later)
