"""Process settings: what an operator types is read as meant, and combinations that cannot
work are refused at start, not on the first request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dayzero.settings import Settings


@pytest.mark.parametrize(
    ("raw", "keys"), [("sesame", ["sesame"]), ("a, b,c", ["a", "b", "c"]), ('["x", "y"]', ["x", "y"]), ("", [])]
)
def test_api_keys_are_a_comma_separated_list_or_json(monkeypatch, raw, keys):
    monkeypatch.setenv("DAYZERO_API_KEYS", raw)
    assert Settings().api_keys == keys


def test_a_triton_backend_without_a_gpu_is_refused():
    with pytest.raises(ValidationError, match="attention_backend=triton"):
        Settings(attention_backend="triton", device="cpu")
    assert Settings(attention_backend="triton", device="cuda", handoff="redis").attention_backend == "triton"


def test_a_browser_reconnect_arrives_inside_the_cancel_grace():
    settings = Settings()
    assert settings.disconnect_grace_s >= 5  # EventSource retries after ~3 s by default
    assert settings.sse_retry_ms < settings.disconnect_grace_s * 1000  # and sooner with our retry:


def test_a_decode_batch_past_what_was_tested_is_refused():
    with pytest.raises(ValidationError, match="max_batch"):
        Settings(max_batch=4097)
    assert Settings(max_batch=4096).max_batch == 4096
