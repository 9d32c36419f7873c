"""The README against the code it describes: its error table lists every status the gateway answers
with an error body, and its settings table gives each setting the default the code has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dayzero.settings import Settings
from services.gateway.error_fields import param_path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GATEWAY = ROOT / "services" / "gateway"
ANSWERS = ("APIError", "error_response", "HTTPException")  # what a route or middleware answers an error with
RAW_STATUS = re.compile(r'"([1-5]\d\d) [A-Z][A-Za-z ]+"')  # a status line written by hand (deadline.py)


def _gateway_error_statuses() -> set[int]:
    statuses = set()
    for path in GATEWAY.glob("*.py"):
        text = path.read_text()
        statuses |= {int(status) for status in RAW_STATUS.findall(text)}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ANSWERS:
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, int):
                    statuses.add(first.value)
    return statuses


def test_error_table_lists_every_status_the_gateway_answers_with_an_error():
    """The table had no 415 (a body sent with Content-Encoding) nor 431 (a head over 64 KiB)."""
    table = {int(status) for status in re.findall(r"^\| ([1-5]\d\d)\b", README, re.M)}
    statuses = _gateway_error_statuses()
    assert {400, 408, 415, 431, 503} <= statuses  # the walk above finds them where they are written
    assert statuses - table == set()


def _table_defaults() -> dict[str, str]:
    """The "Others a user may need" table: variable -> its Default column."""
    table = README.split("Others a user may need:", 1)[1].lstrip().split("\n\n", 1)[0]
    return dict(re.findall(r"^\| `(DAYZERO_\w+)` \| ([^|]*) \|", table, re.M))


def _value(shown: str) -> object:
    """A default as the README writes it: ``8 MiB``, ``4096``, `` `lists` ``, nothing (None)."""
    shown = shown.strip().strip("`")
    if number := re.fullmatch(r"(\d+) MiB", shown):
        return int(number[1]) << 20
    return float(shown) if re.fullmatch(r"\d+(\.\d+)?", shown) else shown or None


@pytest.mark.parametrize("variable", sorted(_table_defaults()))
def test_settings_table_gives_the_code_s_defaults(variable):
    assert _value(_table_defaults()[variable]) == Settings.model_fields[variable[8:].lower()].default


def test_settings_table_gives_the_code_s_host_and_port():
    row = re.search(r"^\| `DAYZERO_HOST` / `DAYZERO_PORT` \| `([^`]+)` \|", README, re.M)
    host, port = row[1].rsplit(":", 1)
    fields = Settings.model_fields
    assert (host, int(port)) == (fields["host"].default, fields["port"].default)


# a field path with an index: `prompt[3]`, `messages[0].content` (or the dotted `prompt.3` it was)
INDEXED_PATH = re.compile(r"`([a-z_]+(?:\.[a-z_]+)*(?:\.\d+|\[\d+\])(?:\.[a-z_]+|\.\d+|\[\d+\])*)`")


def test_readme_writes_param_paths_as_the_gateway_does():
    """The README named a refused prompt of several `prompt.3` and a stop string `stop.N`, while the
    gateway's ``param`` writes OpenAI's ``prompt[3]``, ``stop[1]``."""
    paths = INDEXED_PATH.findall(README)
    assert "prompt[3]" in paths
    for path in paths:
        parts = [int(part) if part.isdigit() else part for part in re.findall(r"[a-z_]+|\d+", path)]
        assert param_path(parts) == path
