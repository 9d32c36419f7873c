"""`dayzero doctor` against the real stack, and against nothing."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time

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


def test_doctor_passes_a_healthy_stack_without_a_tokenizer_with_what_needs_text_skipped(bare_stack):
    """Token-id prompts, token_ids answers: 4 of 7 checks failed on text prompts' 400s (exit 1)."""
    out = _doctor(bare_stack.url)
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert out.returncode == 0 and report["ok"], [c for c in report["checks"] if c["status"] != "pass"]
    assert {name: c["status"] for name, c in checks.items()} == {
        "gateway ready": "pass",
        "weights checked": "pass",
        "queue, prefill, decode": "pass",
        "text and image paths": "skip",
        "stop, EOS, max tokens": "skip",
        "bad input refused": "pass",
        "cancel frees blocks": "pass",
    }
    assert checks["gateway ready"]["detail"].endswith("; no tokenizer.json: token-id prompts, token_ids answers")
    assert checks["text and image paths"]["detail"].startswith("a token-id request skipped the vision stage; ")
    assert "chats need the chat template of a tokenizer.json" in checks["text and image paths"]["detail"]
    endings = checks["stop, EOS, max tokens"]["detail"]
    assert endings.startswith("max_tokens -> length, EOS -> stop (token_ids); stop strings not checked: ")
    assert "text prompt, stop strings, bad image -> 400" in checks["bad input refused"]["detail"]


def test_doctor_fails_with_exit_1_when_nothing_answers():
    """The failure names the URL it asked (it was "ConnectError: [Errno 111] Connection refused")."""
    url = f"http://127.0.0.1:{free_port()}"
    out = _doctor(url)
    (check,) = json.loads(out.stdout)["checks"]
    assert out.returncode == 1 and check["status"] == "fail"
    assert check["detail"].startswith(f"GET {url}/v1/models: ConnectError: ")
    assert check["detail"].endswith(f"; is the gateway running at {url}?")


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


@pytest.mark.parametrize(
    ("key", "why"),
    [(None, "the gateway asks for an API key (--api-key)"), ("wrong", "the gateway refuses the --api-key given")],
)
def test_a_key_the_gateway_refuses_is_named_so(key, why):
    """A gateway under DAYZERO_API_KEYS was asked whether it was the gateway ("is URL the gateway's URL?")."""

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"error": {"message": "missing or invalid API key", "code": "invalid_api_key"}}'
            self.send_response(401)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        (check,) = Doctor(f"http://127.0.0.1:{site.server_port}", api_key=key).run()
    finally:
        site.shutdown()
        site.server_close()
    assert check.detail == f"GET http://127.0.0.1:{site.server_port}/v1/models answered HTTP 401: {why}"


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
    assert out.returncode == 1 and check["status"] == "fail"
    assert check["detail"].startswith(f"GET {url}/v1/models: ReadTimeout")
    assert check["seconds"] < 5


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A stand-in gateway: its streams send only keep-alives (their request waits on a dead
    worker), and its /metrics are those of workers that serve a float checkpoint."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-request-id", "r1")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:  # noqa: N802
        body = "".join(
            f'dayzero_weights_checked_tensors{{stage="{s}",worker="{s}0"}} 0.0\n' for s in ("prefill", "decode")
        )
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stand_in():
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    serving = threading.Thread(target=site.serve_forever, daemon=True)
    serving.start()
    yield f"http://127.0.0.1:{site.server_port}"
    site.shutdown()
    site.server_close()
    serving.join()


def test_a_stream_kept_open_by_keep_alives_fails_the_check_at_the_timeout(stand_in):
    """Keep-alives restart httpx's read timeout: the check waited as long as the request (an hour)."""
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"the stream did not end within 1 s \(--timeout\)"):
        Doctor(stand_in, timeout_s=1).check_queue_prefill_decode()
    assert time.monotonic() - start < 5


def test_a_float_checkpoint_passes_the_weight_check_with_nothing_to_check(stand_in):
    assert Doctor(stand_in).check_weights() == "no quantized tensors in the served checkpoint: nothing to check"
