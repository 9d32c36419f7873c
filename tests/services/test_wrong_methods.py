"""Every route the gateway serves, asked with each method it does not take: a 405 that says so in
OpenAI's shape and words, with the methods it takes in Allow; a URL no route serves, a 404 in its
words (the gateway in-process, on a real Redis)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _routes(routes: list) -> list:
    """The routes, those of the routers included (FastAPI keeps each as one entry) among them."""
    found = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        found += _routes(inner.routes) if inner is not None else [route] if getattr(route, "methods", None) else []
    return found


def test_each_route_answers_each_method_it_does_not_take_with_a_405_naming_it(gateway):
    """Starlette's message was "Method Not Allowed", with nothing of the method or the URL."""
    taken: dict[str, set[str]] = {}
    for route in _routes(gateway.app.routes):
        path = route.path.replace("{request_id}", "r1").replace("{model:path}", "m")
        taken.setdefault(path, set()).update(route.methods)
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/models", "/health"} <= taken.keys()
    for path, methods in taken.items():
        for method in sorted(METHODS - methods):
            r = gateway.request(method, path)
            assert r.status_code == 405, (method, path, r.text)
            allow = set(r.headers["allow"].split(", "))  # (a GET's HEAD twin, a route apart, was not named)
            assert allow == methods, (method, path, allow)
            if method == "HEAD":
                continue  # (no body)
            message = f"Invalid method for URL ({method} {path}): it takes {r.headers['allow']}"
            assert r.json() == {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "method_not_allowed",
                }
            }, (method, path)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/health/"), ("GET", "/ready/"), ("POST", "/v1/chat/completions/"), ("GET", "/nothing")],
)
def test_a_url_no_route_serves_is_a_404_naming_it(gateway, method, path):
    """A path with a slash more was redirected (307 to the path without it): OpenAI's API answers
    404 ("Invalid URL (POST /v1/chat/completions/)"). The 404's message was Starlette's "Not Found",
    its code null."""
    r = gateway.request(method, path, follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers, (r.status_code, r.headers)
    assert r.json() == {
        "error": {
            "message": f"Invalid URL ({method} {path})",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_url",
        }
    }


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models/other", None),
        ("POST", "/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/completions", {"model": "other", "prompt": "hi"}),
        ("POST", "/tokenize", {"model": "other", "prompt": "hi"}),
        ("POST", "/detokenize", {"model": "other", "tokens": [1]}),
    ],
)
def test_a_model_this_server_does_not_serve_is_a_404_typed_as_openai_types_it(gateway, method, path, body):
    """OpenAI answers an unknown model 404 invalid_request_error, code model_not_found ("The model
    `x` does not exist or you do not have access to it."), a completion's as a model card's; it was
    typed not_found_error, a type OpenAI's API does not send, and the POSTs answered 400."""
    r = gateway.request(method, path, json=body)
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "model_not_found", "model")
    assert error["message"].startswith("The model 'other' does not exist"), error


def test_a_model_not_served_is_refused_before_its_prompt_is_rendered(gateway):
    """The model is checked first: a prompt was rendered, its images decoded and its text tokenized
    for a request refused anyway (a 2.4 MB chat of a 768x768 image and 20,000 words: its refusal took
    128 ms, 48 ms now), and an image that does not decode was the refusal's reason."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": "other", "messages": [{"role": "user", "content": [image]}]}
    r = gateway.post("/v1/chat/completions", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found"), r.text
