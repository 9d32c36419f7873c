"""A bounded schemathesis run against the gateway's own OpenAPI schema, real stack behind it:
no input gets a 5xx. The schema names the served model, so bodies get past "unknown model"
into admission, prefill and decode (completions capped at 8 tokens to keep it short)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from .conftest import MODEL, start_stack


@pytest.fixture(scope="module")
def fuzzed(text_dir, tmp_path_factory):
    extra = {"DAYZERO_MAX_TOKENS_LIMIT": "8", "DAYZERO_MAX_CONTEXT": "512"}
    stack = start_stack(text_dir, tmp_path_factory.mktemp("fuzz"), {"vision": 0, "prefill": 1, "decode": 1}, extra)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def api(fuzzed):
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")
    body = schema.raw_schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    assert body["enum"] == [MODEL]
    return schema


def test_no_input_gets_a_server_error(api, fuzzed):
    """Each operation of the schema, ``max_examples`` generated cases (schemathesis' own pytest
    plugin does not load under this pytest, so hypothesis drives the operations' strategies)."""
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/requests/{request_id}/stream",
    }
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        def call(case) -> None:
            response = case.call(base_url=fuzzed.url, timeout=60)
            case.validate_response(response, checks=[not_a_server_error])

        call()
