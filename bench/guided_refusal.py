"""How long the gateway takes to refuse a huge schema (400): an object of N optional properties as a
chat's ``response_format``, as one forced tool's parameters and as one offered tool's, posted to the gateway app
in-process (a real Redis of its own; refused before it queues, so no worker), after one warm-up
request. Each size is new to the process (its compile, if any, is not cached). A schema small enough to
be accepted is queued and answered 503 ``no_worker`` after 1 s (no worker here).

    .venv/bin/python bench/guided_refusal.py [--properties 8000 4000 300]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient
from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import scratch_redis
from dayzero.settings import Settings
from services.gateway.app import make_app

TYPES = ("integer", "string", "number", "boolean")


def properties(n: int, salt: str) -> dict:
    props = {f"{salt}{j}": {"type": TYPES[j % len(TYPES)]} for j in range(n)}
    return {"type": "object", "properties": props}


def bodies(n: int, model: str) -> dict[str, dict]:
    messages = [{"role": "user", "content": "hi"}]
    formatted = {"type": "json_schema", "json_schema": {"name": "x", "schema": properties(n, "r")}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": properties(n, "t")}}]
    return {
        "response_format": {"model": model, "messages": messages, "response_format": formatted},
        "tools": {"model": model, "messages": messages, "tools": tools, "tool_choice": "required", "max_tokens": 4},
        # offered, not enforced: max_tokens past its limit makes an accepted one a 400 too, after its rendering
        "tools (auto)": {
            "model": model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
            "max_tokens": 10**9,
        },
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--properties", type=int, nargs="+", default=[8000, 4000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_redis(Path(tmp)) as port:
        settings = Settings(
            checkpoint=write_demo_checkpoint(Path(tmp) / "demo"),
            redis_url=f"redis://127.0.0.1:{port}/0",
            no_worker_timeout_s=1.0,  # a schema small enough to be queued: 503 no_worker within 1 s (no worker here)
        )
        with TestClient(make_app(settings)) as client:
            warm = {**bodies(3, settings.model_name)["response_format"], "max_tokens": 10**9}  # 400 after the grammar
            assert client.post("/v1/chat/completions", json=warm).status_code == 400
            print("| properties | field | status | s to the answer | message |\n|--:|---|--:|--:|---|")
            for n in args.properties:
                for field, body in bodies(n, settings.model_name).items():
                    start = time.perf_counter()
                    r = client.post("/v1/chat/completions", json=body)
                    took = time.perf_counter() - start
                    message = r.json().get("error", {}).get("message", "")[:110] if r.status_code != 200 else ""
                    print(f"| {n} | {field} | {r.status_code} | {took:.3f} | {message} |", flush=True)


if __name__ == "__main__":
    main()
