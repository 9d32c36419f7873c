"""The gateway's walks of schemas, remembered (dayzero.chat.schema_walks): a schema seen again is
not walked again (each request's 128 forced tools were, ~30 ms of CPU a request)."""

from __future__ import annotations

from dayzero.chat import schema_walks
from dayzero.chat.schema_walks import WalkedSchemas

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
NOTHING = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}  # nothing satisfies it


def _counted(monkeypatch) -> list:
    walks = []
    walk = schema_walks.schema_problem

    def counting(schema, steps):
        walks.append(steps)
        return walk(schema, steps)

    monkeypatch.setattr(schema_walks, "schema_problem", counting)
    return walks


def test_a_schema_seen_again_is_not_walked_again(monkeypatch):
    walks, walked = _counted(monkeypatch), WalkedSchemas()
    for _ in range(3):
        assert walked.problem(dict(PERSON), 64) is None
        assert "nothing satisfies it" in walked.problem(NOTHING, 64)
    assert walks == [64, 64]
    assert walked.problem(PERSON, 256) is None and walks == [64, 64, 256]  # walked further: walked anew


def test_the_latest_used_are_kept(monkeypatch):
    walks, walked = _counted(monkeypatch), WalkedSchemas(most=2)
    schemas = [{"type": "string", "maxLength": n} for n in range(3)]
    for schema in (schemas[0], schemas[1], schemas[0], schemas[2]):  # (the 1st used again: the 2nd goes)
        walked.problem(schema, 8)
    walked.problem(schemas[0], 8)
    walked.problem(schemas[1], 8)
    assert len(walks) == 4, walks
