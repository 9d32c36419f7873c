"""`dayzero doctor` against the real stack, and against nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dayzero.doctor import Doctor
from dayzero.procs import free_port

from .conftest import MODEL


def _doctor(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dayzero.cli", "doctor", url, "--json"], capture_output=True, text=True, timeout=300
    )


def test_doctor_passes_on_a_healthy_stack(stack):
    out = _doctor(stack.url)
    report = json.loads(out.stdout)
    assert out.returncode == 0, [c for c in report["checks"] if c["status"] != "pass"]
    assert [c["status"] for c in report["checks"]] == ["pass"] * 7
    assert any("image went through" in c["detail"] for c in report["checks"])
    weights = next(c for c in report["checks"] if c["name"] == "weights checked")
    assert "prefill: " in weights["detail"] and "decode: " in weights["detail"]  # every worker's start-up check


def test_doctor_fails_with_exit_1_when_nothing_answers():
    out = _doctor(f"http://127.0.0.1:{free_port()}")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["checks"][0]["status"] == "fail"


def test_doctor_takes_the_openai_base_url_and_names_a_wrong_one(stack):
    assert Doctor(f"{stack.url}/v1/").check_ready().startswith(f"model {MODEL}, workers ")
    wrong = Doctor(f"{stack.url}/v1/models")  # not the gateway's root: its /v1/models is a 404
    with pytest.raises(AssertionError) as failed:
        wrong.check_ready()
    message = str(failed.value)
    assert message.startswith(f"GET {stack.url}/v1/models/v1/models answered HTTP 404 without a model list; ")
    assert f"is {stack.url}/v1/models the gateway's URL" in message
