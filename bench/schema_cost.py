"""What a schema's size check says of it beside what it costs: for schemas built to slip past a count
of subschemas as written (a $ref with sibling keywords, an allOf of unions, a union with siblings, a
forced tool's properties referring to a shared definition, objects merged past a row of
llguidance's parser, an object of hundreds of short patternProperties or of tens of long ones),
the subschemas as written, the check's verdict (``size_problem`` under the default limits; a tool: the
gateway's ``_enforced_schemas``), llguidance's compile of the grammar in a fresh process (seconds, peak RSS,
the symbols of the grammar it built: its size, its verdict), and whether a reply fails mid-way (the
row cases: the gateway's first-steps check passes them). The first row, a schema as written at the
default limit of subschemas, is the size that limit admits.

    .venv/bin/python bench/schema_cost.py [--only NAME ...]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from options import bench_parser

from dayzero.chat.grammar import tool_calls_grammar
from dayzero.chat.schema_size import SchemaLimits, _schema_nodes, size_problem

DEFAULTS = SchemaLimits(3000, 120_000, 10_000)
FLAGS = {f"b{i}": {"type": "boolean"} for i in range(4)}


def _object(count: int, prefix: str = "p", required: bool = False) -> dict:
    props = {f"{prefix}{j}": {"type": "integer"} for j in range(count)}
    return {"type": "object", "properties": props, **({"required": list(props)} if required else {})}


def _late(schema: dict, defs: dict | None = None) -> dict:
    late = {"type": "object", "properties": FLAGS | {"u": schema}, "required": [*FLAGS, "u"]}
    return late | ({"$defs": defs} if defs else {})


def _tagged_fields(fields: int, variants: int, properties: int) -> dict:
    """``fields`` required properties, each one union of ``variants`` tagged objects (by ``$ref``) and
    a sibling keyword (so each field is a copy of the union, each branch merged with it)."""
    tagged = lambda j: {"properties": {"kind": {"const": f"v{j}"}} | _object(properties, f"f{j}_")["properties"]}  # noqa: E731
    defs = {f"v{j}": {"type": "object", **tagged(j), "required": ["kind"]} for j in range(variants)}
    union = {"anyOf": [{"$ref": f"#/$defs/v{j}"} for j in range(variants)], "type": "object"}
    return {
        "type": "object",
        "properties": {f"x{i}": union for i in range(fields)},
        "required": [f"x{i}" for i in range(fields)],
        "$defs": defs,
    }


def _allof_unions(count: int, branches: int) -> dict:
    return {"allOf": [{"anyOf": [_object(1, f"k{i}_{j}_", True) for j in range(branches)]} for i in range(count)]}


def cases() -> dict[str, tuple[str, dict]]:
    """name -> (kind: json | tool, schema)."""
    refs = lambda n, d, sib, required=False: {  # noqa: E731
        "type": "object",
        "properties": {f"r{i}": {"$ref": "#/$defs/d", **sib} for i in range(n)},
        "required": [f"r{i}" for i in range(n)],
        "$defs": {"d": _object(d, required=required)},
    }
    two = lambda kind, i, half: (  # noqa: E731
        {"allOf": [_object(half, f"x{i}_"), _object(half, f"y{i}_")]}
        if kind == "allOf"
        else {"$ref": f"#/$defs/d{i}", "properties": _object(half, f"y{i}_")["properties"]}
    )
    defs = {f"d{i}": _object(200, f"x{i}_") for i in range(2)}
    named = lambda count: {f"^q{j}$": {"type": "integer"} for j in range(count)}  # noqa: E731
    # (told apart at their end only: every pair of names read whole by llguidance's overlap check)
    long_named = lambda count, shared: {f"^{'a' * shared}{j:02d}$": {"type": "integer"} for j in range(count)}  # noqa: E731
    return {
        "as written: 2,999 required": ("json", _object(2999, required=True)),
        "ref+sibling 20 x 490": ("json", refs(20, 490, {"type": "object"})),
        "plain ref 20 x 490": ("json", refs(20, 490, {})),
        "allOf of 3 unions of 10": ("json", _allof_unions(3, 10)),
        "allOf of 4 unions of 5": ("json", _allof_unions(4, 5)),
        "30 fields of one 10-variant union": ("json", _tagged_fields(30, 10, 8)),
        "union+siblings 40 x 60": (
            "json",
            _late(_object(60) | {"anyOf": [{"required": [f"p{j}"]} for j in range(40)]}),
        ),
        "tool 300 refs x 300 required": ("tool", refs(300, 300, {}, True)),
        "tool 1000 refs x 1000 required": ("tool", refs(1000, 1000, {}, True)),
        "union of allOf 2 x (200+200)": ("json", _late({"anyOf": [two("allOf", i, 200) for i in range(2)]})),
        "union of ref+props 2 x (200+200)": ("json", _late({"anyOf": [two("ref", i, 200) for i in range(2)]}, defs)),
        "allOf 250+250 alone": ("json", _late(two("allOf", 0, 250))),
        "474 optional + 100 patterns": ("json", _late(_object(474) | {"patternProperties": named(100)})),
        "200 patterns": ("json", {"type": "object", "patternProperties": named(200)}),
        "400 patterns": ("json", {"type": "object", "patternProperties": named(400)}),
        "64 patterns of 144 bytes": ("json", {"type": "object", "patternProperties": long_named(64, 140)}),
        "31 patterns of 104 bytes": ("json", {"type": "object", "patternProperties": long_named(31, 100)}),
    }


_COMPILE = """
import json, resource, sys, time
import llguidance
from dayzero.chat.grammar import _byte_tokenizer, error_summary, parser_limits
lark, reply = json.loads(sys.stdin.read())
start = time.perf_counter()
matcher = llguidance.LLMatcher(_byte_tokenizer(), lark, log_level=2, limits=parser_limits())  # (its size: stderr)
seconds = time.perf_counter() - start
verdict = error_summary(matcher.get_error())[:60] if matcher.is_error() else "ok"
fails = None
if reply is not None and not matcher.is_error():
    tokens = list(reply.encode())
    fails = matcher.try_consume_tokens(tokens) < len(tokens) or matcher.is_error()
status = open("/proc/self/status").read()  # (this process's own peak: ru_maxrss keeps its parent's across exec)
rss = int(status.split("VmHWM:")[1].split()[0]) / 1024 if "VmHWM:" in status else resource.getrusage(0).ru_maxrss / 1024
print(json.dumps([seconds, rss, verdict, fails]))
"""


def measure(kind: str, schema: dict) -> list:
    if kind == "tool":
        lark = tool_calls_grammar([{"type": "function", "function": {"name": "f", "parameters": schema}}], '"|"')
        reply = None
    else:
        from dayzero.chat.grammar import json_grammar

        lark = json_grammar(schema)
        late = schema.get("properties", {}).keys() >= FLAGS.keys()
        reply = '{"b0": true, "b1": true, "b2": true, "b3": true, "u": {' if late else None
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE], input=json.dumps([lark, reply]), capture_output=True, text=True
    )
    if run.returncode != 0:
        return [None, None, run.stderr.strip()[-60:], None, None]
    built = re.search(r"==> \d+ terminals; .* with (\d+) symbols", run.stderr)  # (after llguidance's optimization)
    return [*json.loads(run.stdout), int(built[1]) if built else None]


def verdict(kind: str, schema: dict) -> str:
    if kind == "tool":
        from services.gateway.chat import _enforced_schemas
        from services.gateway.chat_schemas import ChatCompletionRequest

        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        body = ChatCompletionRequest(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=[tool], tool_choice="required"
        )
        problem = size_problem(_enforced_schemas(body), DEFAULTS)
    else:
        problem = size_problem([schema], DEFAULTS)
    return "accepted" if problem is None else "400: " + problem[:48]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--only", nargs="*", help="the cases to run (by name): all by default")
    args = parser.parse_args()
    print(
        "| case | as written | check (default limits) | compile s | peak MB | symbols | llguidance | fails mid-reply |"
    )
    print("|---|--:|---|--:|--:|--:|---|---|")
    for name, (kind, schema) in cases().items():
        if args.only and name not in args.only:
            continue
        written = sum(1 for _ in _schema_nodes([schema]))
        seconds, rss, compiled, fails, symbols = measure(kind, schema)
        timing = f"{seconds:.2f} | {rss:.0f}" if seconds is not None else "- | -"
        timing += f" | {symbols:,}" if symbols is not None else " | -"
        print(f"| {name} | {written:,} | {verdict(kind, schema)} | {timing} | {compiled} | {fails} |", flush=True)


if __name__ == "__main__":
    main()
