"""A bounded schemathesis run against the gateway's own OpenAPI schema, real stack behind it:
no input gets a 5xx. The schema names the served model, so bodies get past "unknown model"
into admission, prefill and decode (completions capped at 8 tokens to keep it short)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
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


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_input_gets_a_server_error(case, fuzzed):
    response = case.call(base_url=fuzzed.url, timeout=60)
    case.validate_response(response, checks=[not_a_server_error])
