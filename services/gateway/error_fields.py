"""What a body's validation error names: the field as OpenAI's ``param`` writes it, and OpenAI's ``code``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

INVALID_UNICODE = "invalid_unicode"  # text with a lone surrogate: no tokenizer takes it
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "body"}
_KEY_TAG = "[key]"  # pydantic's, after a map's key that was refused (not its value)
_NAME = re.compile(r"[^\W\d][\w-]*")  # a map's key written after a dot
# the code OpenAI's API gives a body's invalid field, by pydantic's error type (with a bound: by the
# bound's kind, integer or decimal)
_CODES = {
    "missing": "missing_required_parameter",
    "literal_error": "invalid_value",
    "string_too_long": "string_above_max_length",
    "string_pattern_mismatch": "invalid_value",  # (a tool's name)
    "string_unicode": INVALID_UNICODE,  # (a bounded string's; an unbounded one's is the tokenizer's)
    "too_long": "array_above_max_length",
    "too_many_properties": "object_above_max_properties",  # (a map's: body_model._Body)
    "extra_forbidden": "unknown_parameter",  # a key an object of fixed keys lacks (chat_template_kwargs.foo)
    "value_error": "invalid_value",  # a check of the server's own (a ValueError's; OpenAI's null for some)
    # the server's own checks named by OpenAI's code (body_model.coded): a parameter of the other
    # endpoint, a value of a parameter this server does not implement (null was theirs)
    "unsupported_parameter": "unsupported_parameter",
    "unsupported_value": "unsupported_value",
}
_BOUNDS = {"greater_than_equal": "below_min", "less_than_equal": "above_max"}  # (the bounds fields use)


def param_path(parts: Iterable[str | int]) -> str:
    """A field's path as OpenAI's ``param`` writes it: ``messages[0].content``, ``metadata.topic`` (it
    was dotted: ``messages.0.content``, as pydantic's locations are). A map's key that is no name is
    written as a JSON string in brackets: ``metadata["a.b]"]`` (``metadata.a.b]`` read as two fields)."""
    return "".join(_step(part) for part in parts).removeprefix(".")


def _step(part: str | int) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    return f".{part}" if _NAME.fullmatch(part) else f"[{json.dumps(part, ensure_ascii=False)}]"


def validation_code(error: dict) -> str:
    """OpenAI's ``code`` for a validation error: ``invalid_type``, ``integer_below_min_value``,
    ``decimal_above_max_value``, ``empty_string``, ... (they were all null), else ``invalid_value``."""
    kind = error.get("type", "")
    if kind == "literal_error" and "input" in error and error["input"] is None:
        return "invalid_type"  # a required field of fixed values (a role) sent as null, as others
    if kind in _BOUNDS:
        bound = next(iter(error.get("ctx", {}).values()), None)
        return f"{'decimal' if isinstance(bound, float) else 'integer'}_{_BOUNDS[kind]}_value"
    least = error.get("ctx", {}).get("min_length")
    if kind == "too_short" and least == 1:  # OpenAI's for empty messages (a list's least length is 1 here)
        return "empty_array"
    if kind == "string_too_short":  # (an empty stop string)
        return "empty_string" if least == 1 else "string_below_min_length"
    return "invalid_type" if kind.endswith("_type") else _CODES.get(kind, "invalid_value")  # (not a finite number...)


def tag_error(error: dict) -> dict:
    """A tagged union's refused tag (a content part's ``type``) as the tag field's own error, as OpenAI
    tells it: left out, ``missing`` (OpenAI: "Missing required parameter: 'messages[2].content[0].type'");
    of another value, that field's ``literal_error`` ("Input should be 'text' or 'image_url'"; null is
    invalid_type there, as for every required field of fixed values). pydantic names the part and
    calls each invalid_value: "Input tag 'None' found using 'type' does not match any of the expected tags"."""
    kind, ctx = error.get("type"), error.get("ctx", {})
    tag = str(ctx.get("discriminator", "")).strip("'")  # (pydantic quotes a field's name; a function's is no name)
    if kind not in ("union_tag_not_found", "union_tag_invalid") or not tag.isidentifier():
        return error
    where = (*error.get("loc", ()), tag)
    if kind == "union_tag_not_found":
        return {"type": "missing", "loc": where, "msg": "Field required"}
    tags, _, last = ctx["expected_tags"].rpartition(", ")
    told = f"{tags} or {last}" if tags else last
    value = error["input"].get(tag) if isinstance(error.get("input"), dict) else None
    return {"type": "literal_error", "loc": where, "msg": f"Input should be {told}", "input": value}


def specificity(error: dict) -> tuple[int, bool]:
    """The deepest error is the most specific of a union's; of equally deep ones, a value's fault
    (a lone surrogate in a string) says more than another member's type ("not an integer")."""
    return len(error.get("loc", ())), not error.get("type", "").endswith("_type")


def field_path(loc: tuple, body: object) -> list:
    """The fields, indexes and map keys of ``loc`` (pydantic's error location) that lead into the body as
    sent: a union member's tag is left out though it may look like a field ("messages[0].content[0].text.text"
    named a text part's text with its tag "text"; "tool_choice.NamedToolChoice.function"), and the last
    field kept where the object it is in lacks it (a missing field). A refused key names its map; a map's
    value, its key (a key that was no name, "a.b", was left out: the map was named). Of the ways to read
    ``loc``, the one that follows the body furthest."""
    parts, known = list(loc), {}  # (each part is read as a tag and as a field: known ways, not 2**len)

    def read(i: int, within: object) -> tuple[int, list]:  # (parts followed into the body, path)
        if (i, id(within)) not in known:
            known[i, id(within)] = ways_from(i, within)
        return known[i, id(within)]

    def ways_from(i: int, within: object) -> tuple[int, list]:
        if i == len(parts) or parts[i] == _KEY_TAG:
            return 0, []
        part, ways = parts[i], [read(i + 1, within)]  # the part as a tag
        refused_key = parts[i + 1 : i + 2] == [_KEY_TAG]
        if isinstance(within, dict) and part in within and not refused_key or _indexes(part, within):
            followed, path = read(i + 1, within[part])
            ways.append((followed + 1, [part, *path]))
        elif isinstance(within, dict) and _field_part(part) and not any(map(_field_part, parts[i + 1 :])):
            ways.append((0, [part]))  # (a field a string lacks is a tag)
        return max(ways, key=lambda way: (way[0], len(way[1])))

    return read(0, body)[1]


def _indexes(part: object, items: object) -> bool:
    return isinstance(items, list) and isinstance(part, int) and 0 <= part < len(items)


def _field_part(part: object) -> bool:
    """Location parts that may name a field or an index (not pydantic's union-member tags)."""
    if isinstance(part, int):
        return True
    text = str(part)
    return text.isidentifier() and text not in _TYPE_TAGS
