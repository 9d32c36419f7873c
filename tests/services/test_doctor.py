"""`dayzero doctor` against the real stack, and against nothing."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading

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


def test_doctor_reports_a_server_that_is_not_the_gateway_in_one_line():
    """An ordinary web server (an HTML 404 page): one line that names the URL, no page layout."""
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    serving = threading.Thread(target=site.serve_forever, daemon=True)
    serving.start()
    try:
        (check,) = Doctor(f"http://127.0.0.1:{site.server_port}").run()
    finally:
        site.shutdown()
        site.server_close()
        serving.join()
    assert check.status == "fail" and "\n" not in check.detail and "  " not in check.detail
    assert check.detail.startswith(f"GET http://127.0.0.1:{site.server_port}/v1/models answered HTTP 404 ")


def test_doctor_gives_up_on_a_gateway_that_never_answers():
    """A socket that takes connections and never replies: readiness fails after its wait (at most
    10 s; here ``--timeout 1``), with exit 1."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        out = subprocess.run(
            [sys.executable, "-m", "dayzero.cli", "doctor", url, "--json", "--timeout", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    (check,) = json.loads(out.stdout)["checks"]
    assert out.returncode == 1 and check["status"] == "fail" and check["detail"].startswith("ReadTimeout")
    assert check["seconds"] < 5
