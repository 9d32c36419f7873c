"""The README against the code it describes: its error table lists every status the gateway answers
with an error body, and its settings table gives each setting the default the code has; docs/metrics.md
names every error code the gateway sends."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dayzero.settings import Settings
from services.gateway.error_fields import param_path, validation_code

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


SHARED = ROOT / "shared" / "dayzero"
CODE_SOURCES = [*GATEWAY.glob("*.py"), *(SHARED / "serving").glob("*.py"), SHARED / "guided.py"]


def _assigned(target: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr]]:
    """(the name or attribute assigned, its value) of an assignment, each of a tuple's."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return [pair for t, v in zip(target.elts, value.elts, strict=True) for pair in _assigned(t, v)]
    name = getattr(target, "id", getattr(target, "attr", None))
    return [(name, value)] if name is not None else []


def _sent_codes() -> set[str]:
    """The error codes written in the gateway's and the serving loops' code: ``code="..."``, a constant
    given as ``code=NAME``, a literal given a function's ``code`` parameter or assigned to ``code`` (or
    ``self.code``), a table's of codes; and those validation_code builds for pydantic's bound, length and
    type errors."""
    codes, names, constants = set(), set(), {}
    trees = [ast.parse(path.read_text()) for path in CODE_SOURCES]
    with_code = {  # a function's name: the position of its ``code`` parameter
        node.name: [arg.arg for arg in node.args.args].index("code")
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and "code" in [arg.arg for arg in node.args.args]
    }
    for node in (node for tree in trees for node in ast.walk(tree)):
        given = []
        if isinstance(node, ast.Call):
            given = [keyword.value for keyword in node.keywords if keyword.arg == "code"]
            at = with_code.get(getattr(node.func, "id", getattr(node.func, "attr", None)))
            given += node.args[at : at + 1] if at is not None else []
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            for target, value in _assigned(node.targets[0], node.value):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    constants.setdefault(target, value.value)
                given += [value] if target == "code" or target.endswith("CODES") else []
        for value in given:
            inner = value.values if isinstance(value, ast.Dict) else [value]
            inner = [
                part for item in inner for part in ([item.body, item.orelse] if isinstance(item, ast.IfExp) else [item])
            ]
            codes |= {item.value for item in inner if isinstance(item, ast.Constant) and isinstance(item.value, str)}
            names |= {item.id for item in inner if isinstance(item, ast.Name)}
    codes |= {constants[name] for name in names if name in constants}
    bounds = [
        {"type": kind, "ctx": {"bound": bound}}
        for kind in ("greater_than_equal", "less_than_equal")
        for bound in (1, 1.0)
    ]
    lengths = [{"type": kind, "ctx": {"min_length": 1}} for kind in ("too_short", "string_too_short")]
    errors = [*bounds, *lengths, {"type": "string_too_short", "ctx": {"min_length": 2}}, {"type": "int_type"}]
    errors += [{"type": "finite_number"}]  # (any type without a code of its own)
    return (codes | {validation_code(error) for error in errors}) - {""}


def test_the_metrics_doc_names_every_error_code_the_gateway_sends():
    """dayzero_request_errors_total's row listed some and ended in "...": a code seen on a dashboard
    was explained nowhere."""
    row = next(
        line for line in (ROOT / "docs" / "metrics.md").read_text().splitlines() if "request_errors_total" in line
    )
    assert "..." not in row and "\u2026" not in row
    named = set(re.findall(r"`([a-z_]+)`", row))
    assert len(_sent_codes()) > 30 and _sent_codes() - named == set()


def test_readme_quotes_up_s_line_for_a_child_waiting_after_quick_exits_as_up_prints_it():
    """The README quoted "4 times in a row within 60 s of its start": up counts a run from when it first saw
    the child ready (stack_child.py) and says so."""
    from dayzero.stack_child import Child

    child = Child("decode0", "decode", why="exited (code 3)", quick_exits=4, wait_s=4.0, due=0.0)
    assert child.restart_said() in " ".join(README.split()), child.restart_said()
