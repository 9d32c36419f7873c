"""The literals of a JSON schema a reply may write, for the ones a tokenizer cannot: a special
token's text, which llguidance offers as that token where the grammar forces its bytes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .call_parameters import refs_of, value_definitions
from .schema_bounds import subschemas
from .schema_size import written_literals


def spelled_token(schemas: list, tokens: tuple[str, ...]) -> str | None:
    """The first of ``tokens`` (a tokenizer's special tokens' texts) that a literal a reply may write
    spells: a property name (or a required one, written as a property), a const or enum string, a
    regular expression's text (a pattern, a patternProperties name: one merely allowing the token is
    refused too), in ``schemas`` or the definitions they refer to (None: none; a definition nothing
    refers to writes nothing). llguidance cannot write one as text: where the grammar forced its bytes it offered the
    special token itself, which it then refused (a reply failed mid-way: 500)."""
    literals = [
        text
        for node in (node for schema in schemas for node in _reachable(schema))
        for strings in written_literals(node).values()
        for text in strings
    ]
    text = "\0".join(literals)
    return next((token for token in tokens if token in text), None)


def _reachable(schema: object) -> Iterator[dict]:
    """The subschemas of ``schema`` a reply may follow: all but its ``$defs`` / ``definitions``, and
    of those the ones its ``$ref``s reach (and theirs). All of them where a ``$ref`` reaches a
    definition otherwise than as "#/$defs/name" (llguidance follows an $anchor, the $id's URI, a
    percent-encoded "%24defs" too: which definition is not read here)."""
    if not isinstance(schema, dict):
        return subschemas(schema)
    written = {key: value for key, value in schema.items() if key not in ("$defs", "definitions")}
    reached = value_definitions(written, schema)
    if not all(_plain(ref, schema) for ref in refs_of([written, reached])):
        return subschemas(schema)
    return itertools.chain(subschemas(written), subschemas(reached))


def _plain(ref: str, schema: dict) -> bool:
    """Whether ``ref`` is "#" (the root: read) or "#/" and a key of ``schema`` as written
    (value_definitions' reading)."""
    where = ref.removeprefix("#/").partition("/")[0]
    return ref == "#" or ref.startswith("#/") and where in schema and not any(c in where for c in "%~")
