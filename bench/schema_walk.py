"""What the gateway's walk of a JSON schema's grammar costs by its length, beside what it catches:
``grammar_problem`` over the byte vocabulary (the gateway's check: the quote whenever allowed, else
the lowest byte), its compile cached (as for a schema sent again), for walks of 64 bytes (the check's
before, 128 forced tools' each: ``TOOL_PROBE_STEPS``), 256 (``SCHEMA_PROBE_STEPS``, each of up to 32
forced tools': ``tool_probe_steps``) and longer. Schemas: realistic ones (what every constrained
request pays; 32 and 128 forced tools: each one's parameters walked, ms in all), and ones failing
late (a pattern past llguidance's lexer, a required
property whose ``$ref`` is its own object, behind so many required booleans: ~14 bytes each), each
failing mid-reply unless the walk reaches it; and the 128 tools seen again (the gateway's walks are
remembered by each schema's text: ``WalkedSchemas``, first sight as the row above). Each cell:
median ms of ``--runs`` walks, wall / CPU
(the thread's), and "caught" where the walk found it. Compare rows by CPU: on a loaded machine a row
of 128 walks (30-100 ms) is preempted by other processes and its wall time stretches (1-3x at load
4-5 on 2 cores; the 2.7 ms a tool read at load 16 was wall), where one walk (0.2 ms) fits in a time
slice; each tool's walk costs the CPU one schema's does.

    .venv/bin/python bench/schema_walk.py [--runs 5] [--steps 64 256 1024]
"""

from __future__ import annotations

import statistics
import time

from options import bench_parser

from dayzero.chat.grammar import SCHEMA_PROBE_STEPS, _byte_grammars, grammar_problem, json_grammar
from dayzero.chat.schema_walks import TOOL_PROBE_STEPS, WalkedSchemas

STRING, INTEGER = {"type": "string"}, {"type": "integer"}


def _late(flags: int, value: dict) -> dict:
    properties = {f"b{i}": {"type": "boolean"} for i in range(flags)} | {"s": value}
    return {"type": "object", "properties": properties, "required": list(properties)}


def _wide(count: int) -> dict:
    """An object of ``count`` required properties of a few types (an extraction schema)."""
    kinds = [STRING, INTEGER, {"type": "array", "items": STRING}, {"enum": ["a", "b", "c"]}]
    properties = {f"field_{j}": kinds[j % 4] for j in range(count)}
    return {"type": "object", "properties": properties, "required": list(properties)}


PERSON = {
    "type": "object",
    "properties": {"name": STRING, "age": INTEGER, "tags": {"type": "array", "items": STRING}},
    "required": ["name", "age", "tags"],
}
PATTERN = {"type": "string", "pattern": "^((a{1000}){1000}){100}$"}
SELF = {"$ref": "#/$defs/node"}
SCHEMAS = {
    "person (3 fields)": PERSON,
    "extraction (40 required)": _wide(40),
    "extraction (200 required)": _wide(200),
    "open object (a tool's: 4 optional)": {
        "type": "object",
        "properties": {"city": STRING, "unit": {"enum": ["c", "f"]}, "days": INTEGER, "detail": {"type": "boolean"}},
    },
    "late pattern @ ~170 B": _late(12, PATTERN),
    "late pattern @ ~560 B": _late(40, PATTERN),
    "late pattern @ ~1.7 KB": _late(120, PATTERN),
    "late self-$ref @ ~560 B": {
        **_late(40, SELF),
        "$defs": {"node": {"type": "object", "properties": {"c": SELF}, "required": ["c"]}},
    },
}


def _tool(i: int) -> dict:
    """A forced tool's parameters (open: no additionalProperties), its names its own."""
    kinds = {
        "city": STRING,
        "unit": {"enum": ["c", "f"]},
        "days": {**INTEGER, "minimum": 1},
        "detail": {"type": "boolean"},
    }
    return {"type": "object", "properties": {f"{k}{i}": v for k, v in kinds.items()}, "required": [f"city{i}"]}


TOOL_SCHEMAS = [_tool(i) for i in range(128)]
TOOLS = [json_grammar(schema) for schema in TOOL_SCHEMAS]
SEEN = WalkedSchemas()  # the tools' walks, remembered


def _walk(larks: str | list[str] | WalkedSchemas, steps: int) -> tuple[float, float, str | None]:
    """The walks' wall and CPU ms, and the first problem one found."""
    start, cpu, problems = time.perf_counter(), time.thread_time(), []
    if larks is SEEN:  # (each tool's schema, its walk remembered: seen before)
        problems = [SEEN.problem(schema, steps) for schema in TOOL_SCHEMAS]
    for lark in [larks] if isinstance(larks, str) else larks if isinstance(larks, list) else ():
        problems.append(grammar_problem(lark, _byte_grammars(), steps=steps, first=ord('"')))
    wall, cpu = (time.perf_counter() - start) * 1000, (time.thread_time() - cpu) * 1000
    return wall, cpu, next(filter(None, problems), None)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, nargs="+", default=[TOOL_PROBE_STEPS, SCHEMA_PROBE_STEPS, 1024])
    args = parser.parse_args()
    print("| schema | " + " | ".join(f"{s} B walk: ms (wall / CPU)" for s in args.steps) + " |")
    print("|---|" + "---|" * len(args.steps))
    rows = {name: json_grammar(schema) for name, schema in SCHEMAS.items()}
    rows |= {"32 forced tools (each walked)": TOOLS[:32], "128 forced tools (each walked)": TOOLS}
    rows["128 forced tools seen again (remembered)"] = SEEN
    for name, lark in rows.items():
        cells = []
        _walk(lark, 1)  # (its compile, cached)
        for steps in args.steps:
            _walk(lark, steps)  # (the walks remembered, for the row seen again)
            runs = [_walk(lark, steps) for _ in range(args.runs)]
            wall, cpu = (statistics.median(run[i] for run in runs) for i in (0, 1))
            cells.append(f"{wall:.1f} / {cpu:.1f}" + (" caught" if runs[0][2] else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
