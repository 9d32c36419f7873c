"""Bodies a broken or hostile client sends that the JSON parse and the body gate must answer with a
clear 4xx: a body sent compressed, an integer longer than Python converts (the gateway in-process,
on a real Redis: every request here is refused before it queues)."""

from __future__ import annotations

import gzip
import json
import sys

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import chat


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _post(gateway, body: bytes, *codings: str):
    """POSTs ``body`` with a Content-Encoding line for each of ``codings``."""
    headers = [("content-type", "application/json"), *(("content-encoding", coding) for coding in codings)]
    return gateway.post("/v1/chat/completions", content=body, headers=headers)


GZIPPED = gzip.compress(json.dumps(chat("hi")).encode())


@pytest.mark.parametrize(
    "codings, body",
    [(["gzip"], GZIPPED), (["br"], json.dumps(chat("hi")).encode()), (["gzip", "identity"], GZIPPED)],
    ids=["gzip", "br_not_compressed", "gzip_then_identity_on_two_lines"],
)
def test_a_compressed_body_is_refused_as_such(gateway, codings, body):
    """Nothing here decodes a body: gzip was parsed as it came ("the body is not UTF-8 ... byte 0x8b"),
    and JSON marked br was answered as if no coding had been named. Two Content-Encoding lines are
    one list (RFC 9110 5.3): only the last was read, so a gzip line followed by identity's passed."""
    r = _post(gateway, body, *codings)
    assert r.status_code == 415, r.text
    assert r.headers["accept-encoding"] == "identity"  # (RFC 7694: the codings the server takes)
    assert r.json()["error"] == {
        "message": f"the body is sent with content-encoding '{codings[0]}': send it uncompressed",
        "type": "invalid_request_error",
        "param": None,
        "code": "unsupported_content_encoding",
    }


@pytest.mark.parametrize("codings", [["identity"], ["Identity "], [""], ["identity, identity"], ["identity", ""]])
def test_a_body_in_no_coding_is_read(gateway, codings):
    """Read and answered as usual: here refused for its model's name."""
    r = _post(gateway, json.dumps(chat("hi", model="nope")).encode(), *codings)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text


def test_an_integer_longer_than_python_converts_is_refused_saying_so(gateway):
    """It was FastAPI's "There was an error parsing the body" (json.loads raised a ValueError: Python
    converts integers of at most sys.get_int_max_str_digits() digits)."""
    limit = sys.get_int_max_str_digits()
    r = _post(
        gateway, json.dumps(chat("hi")).replace('"temperature": 0', f'"max_tokens": {"9" * (limit + 1)}').encode()
    )
    assert r.status_code == 400, r.text
    message = f"the body has an integer of more than {limit} digits (the most this server parses)"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_json"}
    assert r.json()["error"] == error
    r = _post(gateway, json.dumps(chat("hi")).replace('"temperature": 0', f'"max_tokens": {"9" * limit}').encode())
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text  # parsed: over its bound


@pytest.mark.parametrize("path", ["/health", "/v1/models"])
def test_a_request_with_no_body_is_not_refused_for_a_stray_content_encoding(gateway, path):
    """Nothing is sent to decode: a GET naming gzip was refused 415 unsupported_content_encoding."""
    r = gateway.get(path, headers={"content-encoding": "gzip"})
    assert r.status_code == 200, r.text
