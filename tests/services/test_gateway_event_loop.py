"""The gateway's event loop serves every open stream: none of its coroutines may call the synchronous
Redis client (``Bus.store``, for the thread pool) directly, or a Redis that stalls stops every stream
for up to that client's socket timeout. Read from the source: a call ``....store.method(...)`` inside
an ``async def`` (a function handed to ``run_in_threadpool`` is not called there)."""

from __future__ import annotations

import ast
from pathlib import Path

import services.gateway

GATEWAY = Path(services.gateway.__file__).parent


def _sync_store_calls(tree: ast.AST) -> list[str]:
    found = []
    for coroutine in (n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)):
        for node in ast.walk(coroutine):
            func = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and func.value.attr == "store":
                found.append(f"{coroutine.name}: {ast.unparse(node)}")
    return found


def test_no_coroutine_of_the_gateway_calls_the_synchronous_store():
    calls = {path.name: _sync_store_calls(ast.parse(path.read_text())) for path in sorted(GATEWAY.glob("*.py"))}
    assert {name: found for name, found in calls.items() if found} == {}


def test_the_check_sees_a_direct_call():
    source = (
        "async def f(gw):\n"
        "    a = await run_in_threadpool(gw.bus.store.request, 1)\n"
        "    return gw.bus.store.request(1)\n"
    )
    assert _sync_store_calls(ast.parse(source)) == ["f: gw.bus.store.request(1)"]
