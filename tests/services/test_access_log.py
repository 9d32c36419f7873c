"""The gateway's access log names the requests each line answers (``dayzero up``'s gateway.log, a
container's output): a client's ``X-Request-Id`` finds its line. A gateway process and its Redis,
no workers: a stream's response starts (and its line is logged) before any token."""

from __future__ import annotations

import httpx
import pytest

from .conftest import MODEL, start_gateway_alone, wait_until


@pytest.fixture(scope="module")
def gateway(demo_dir, tmp_path_factory):
    stack = start_gateway_alone(demo_dir, tmp_path_factory.mktemp("logs"))
    yield stack
    stack.stop()


def _access_lines(stack, path: str) -> list[str]:
    log = (stack.log_dir / "gateway.log").read_text()
    return [line for line in log.splitlines() if f'"POST {path} HTTP/1.1"' in line]


def test_an_access_line_ends_with_the_ids_of_the_requests_it_answered(gateway):
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "n": 2, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        ids = r.headers["x-request-id"]  # one per choice
    refused = httpx.post(f"{gateway.url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30)
    assert refused.status_code == 400 and "x-request-id" not in refused.headers
    lines = wait_until(
        lambda: len(_access_lines(gateway, "/v1/completions")) >= 2 and _access_lines(gateway, "/v1/completions"), 10
    )
    assert lines, "no access line"
    assert lines[0].endswith(f" 200 OK request {ids}")
    assert lines[1].endswith(" 400 Bad Request")  # refused before admission: no request to name
