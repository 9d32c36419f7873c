"""``json_body``'s parse, in-process: where a body nested too deep first goes too deep (the scan reads
the body a slice at a time: here slices of a few bytes, so that strings, escapes and characters cross
them), checked against the parser itself; and the garbage collector, paused while a body parses."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from services.gateway import json_body
from services.gateway.json_body import _deepest_parsed, _first_past, parse

PREFIXES = {
    "bare": "",
    "brackets_in_strings": '{"a": "[[{{", "b": ["]]}}", "\\"[", {"c\\\\": "\\\\"}], "d": ',
    "escapes_in_a_row": '["\\\\\\"[", "\\\\\\\\", "\\u005b\\"", ',
    "characters_of_several_bytes": '{"é𝄞\ud800[": "ü{", "x": [1, "日本[", {}], "y": ',
    "closed_before": "[[[[]]], {}, [[{}]], ",
}


def _where_the_parser_recurses(text: str, depth: int) -> int:
    """The first length of ``text`` whose parse goes past ``depth`` levels (the parser's own verdict)."""
    for length in range(len(text) + 1):
        try:
            json.loads(text[:length].encode("utf-8", "surrogatepass"))
        except RecursionError:
            return length - 1  # the bracket that opened the level too deep
        except ValueError:
            continue
    raise AssertionError("it parsed")


@pytest.mark.parametrize("prefix", PREFIXES.values(), ids=PREFIXES.keys())
@pytest.mark.parametrize("slice_bytes", [1, 3, 7, 1 << 20])
def test_the_first_bracket_too_deep_is_where_the_parser_recursed(monkeypatch, prefix, slice_bytes):
    monkeypatch.setattr(json_body, "_SCANNED_BYTES", slice_bytes)
    depth = _deepest_parsed()  # what the parse below, one call down as well, takes
    text = prefix + "[" * (depth + 5)
    assert _first_past(text, depth) == _where_the_parser_recurses(text, depth)


def test_the_collector_is_paused_while_a_body_parses_and_back_after(monkeypatch):
    """Each ~700 containers parsed set off a collection (of the whole heap, now and then): 8 MB of
    ``[1],`` held the event loop 5.4 s (bench/body_parse.py)."""
    collector_on, loads = [], json.loads
    monkeypatch.setattr(json, "loads", lambda body: collector_on.append(gc.isenabled()) or loads(body))
    assert asyncio.run(parse(b"[[1], [1]]")) == [[1], [1]]
    assert collector_on == [False] and gc.isenabled()
