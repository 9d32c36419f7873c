"""``dayzero doctor URL``: check a running deployment the way an operator brings up a new model.

Each check sends real requests through the gateway and reads its answers and ``/metrics``:
every worker's start-up check of its quantized weights passed,
the request is queued, prefill and decode produce tokens, text and image requests take
different paths, stop strings / EOS / max tokens end requests with the right reason, bad
input is refused with 400, and a cancelled stream gives its blocks back.

A checkpoint served without a tokenizer.json takes token-id prompts and answers with ``token_ids``:
the checks then send token ids and read ids; what needs text (stop strings, chats and so images)
is reported skipped with the reason.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import httpx

from .doctor_gateway import GatewayProbe

# a stream left early: the server's disconnect grace (DAYZERO_DISCONNECT_GRACE_S, 5 s by default) and
# a few heartbeats of the workers' metrics fit in this
CANCEL_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # pass | fail | skip
    seconds: float
    detail: str = ""


class Doctor(GatewayProbe):
    """The checks, each a method that returns its detail or raises (``run`` runs them in order)."""

    def check_ready(self) -> str:
        try:
            answer = self.http.get("/v1/models", timeout=self.ready_wait_s)
        except httpx.TransportError as exc:  # nothing answers there (it said "ConnectError: ...", no URL)
            why = f"{type(exc).__name__}: {exc}"
            raise AssertionError(f"GET {self.root}/v1/models: {why}; is the gateway running at {self.root}?") from None
        if answer.status_code == 401:  # the gateway refusing a key (it was asked whether this is the gateway)
            keyed = "Authorization" in self.http.headers
            why = "the gateway refuses the --api-key given" if keyed else "the gateway asks for an API key (--api-key)"
            raise AssertionError(f"GET {answer.url} answered HTTP 401: {why}")
        try:
            card = answer.json()["data"][0]
            self.model, self.max_len = card["id"], int(card.get("max_model_len") or self.max_len)
        except (ValueError, LookupError, TypeError):  # not JSON, or no model list in it
            raise AssertionError(
                f"GET {answer.url} answered HTTP {answer.status_code} without a model list; is "
                f"{self.root} the gateway's URL (such as http://127.0.0.1:8000)? {answer.text[:200]}"
            ) from None
        ready = self.http.get("/ready", timeout=self.ready_wait_s)
        assert ready.status_code == 200, f"/ready answered {ready.status_code}: {ready.text[:200]}"
        probe = self.http.post("/tokenize", json={"model": self.model, "prompt": "x"}, timeout=self.ready_wait_s)
        self.tokenizer = _error_code(probe) != "no_tokenizer"  # another answer (a proxy's 404): text prompts
        ids = "" if self.tokenizer else "; no tokenizer.json: token-id prompts, token_ids answers"
        warnings = "".join(f"; WARNING {w}" for w in ready.json().get("warnings", []))  # workers that disagree
        return f"model {self.model}, workers {ready.json().get('workers')}{ids}{warnings}"

    def check_weights(self) -> str:
        found = {stage: self.samples("dayzero_weights_checked_tensors", stage=stage) for stage in ("prefill", "decode")}
        missing = [stage for stage, samples in found.items() if not samples]
        assert not missing, f"no {' or '.join(missing)} worker reports a weight check (dayzero_weights_checked_tensors)"
        counts = {stage: int(sum(samples)) for stage, samples in found.items()}
        if not any(counts.values()):  # a float checkpoint: nothing quantized to decode
            return "no quantized tensors in the served checkpoint: nothing to check"
        return ", ".join(f"{stage}: {n} quantized tensors decoded sanely at start" for stage, n in counts.items())

    def check_queue_prefill_decode(self) -> str:
        start, stamps, usage, ids = time.perf_counter(), [], {}, []
        body = {
            "model": self.model,
            "prompt": self.prompt("The quick brown fox"),
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0,
        }
        with self.http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, f"HTTP {r.status_code}"
            assert r.headers.get("x-request-id"), "no request id: the request did not enter the queue"
            for line in self.lines(r):
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if chunk["choices"]:
                        stamps.append(time.perf_counter() - start)
                        ids += chunk["choices"][0].get("token_ids", [])
                    usage = chunk.get("usage") or usage
        assert stamps and usage.get("completion_tokens") == 4, f"usage {usage}, expected 4 completion tokens"
        assert self.tokenizer or len(ids) == 4, f"the chunks' token_ids {ids}, expected 4"
        return f"first token (prefill) {stamps[0] * 1e3:.0f} ms, 4 tokens by {stamps[-1] * 1e3:.0f} ms"

    def check_paths(self) -> str:
        before = self.metric("dayzero_request_queue_time_seconds_count", stage="vision")
        self.complete(prompt=self.prompt("text only"), max_tokens=1)
        after_text = self.metric("dayzero_request_queue_time_seconds_count", stage="vision")
        if not self.tokenizer:
            assert after_text == before, "a token-id request went through the vision stage"
            raise SkipCheck(
                "a token-id request skipped the vision stage; images not checked: an image request is a chat, "
                "and chats need the chat template of a tokenizer.json (the server has none)"
            )
        image = _tiny_png()
        body = {
            "model": self.model,
            "max_tokens": 1,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "describe"},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                }
            ],
        }
        r = self.http.post("/v1/chat/completions", json=body)
        if _error_code(r) == "images_unsupported":
            raise SkipCheck("the model has no vision tower")
        assert r.status_code == 200, f"image request: HTTP {r.status_code}: {r.text[:200]}"
        time.sleep(1.0)  # the vision worker's next heartbeat publishes its counters
        after_image = self.metric("dayzero_request_queue_time_seconds_count", stage="vision")
        assert after_text == before, "a text-only request went through the vision stage"
        assert after_image > after_text, "the image request did not go through the vision stage"
        return "text skipped the vision stage; the image went through it"

    def check_endings(self) -> str:
        length = self.complete(prompt=self.prompt("count"), max_tokens=3, ignore_eos=True)["choices"][0]
        assert length["finish_reason"] == "length", f"max_tokens ended with {length['finish_reason']}"
        eos_id = self._eos()
        eos = self.complete(prompt=self.prompt("stop now"), max_tokens=8, logit_bias={str(eos_id): 100})["choices"][0]
        assert eos["finish_reason"] == "stop" and eos["text"] == "", f"EOS ended with {eos}"
        if not self.tokenizer:  # ids, no text: the count of max_tokens, nothing past EOS (itself or none)
            assert len(length.get("token_ids", [])) == 3, f"max_tokens 3 answered {length}"
            assert eos.get("token_ids") in ([], [eos_id]), f"EOS answered {eos}"
            raise SkipCheck(
                "max_tokens -> length, EOS -> stop (token_ids); stop strings not checked: "
                "they need text, and the server has no tokenizer.json"
            )
        free = self.complete(prompt="a stop string", max_tokens=16, ignore_eos=True)["choices"][0]["text"]
        stop = next((free[i : i + 2] for i in range(3, len(free) - 1) if free[i : i + 2].strip()), None)
        assert stop, "the model produced no text to pick a stop string from"
        cut = self.complete(prompt="a stop string", max_tokens=16, ignore_eos=True, stop=[stop])["choices"][0]
        assert cut["finish_reason"] == "stop" and cut["text"] == free[: free.find(stop)], f"stop string: {cut}"
        return "max_tokens -> length, EOS -> stop, stop string -> stop (text cut before it)"

    def _eos(self) -> int:
        return int(self.http.get("/v1/models").json()["data"][0].get("eos_token_id", 1))

    def check_refusals(self) -> str:
        long = "word " * 200_000 if self.tokenizer else [3] * self.max_len
        cases = {
            "too-long prompt": {"prompt": long, "max_tokens": 1},
            "bad parameters": {"prompt": self.prompt("x"), "temperature": -1},
        }
        if not self.tokenizer:
            cases["text prompt"] = {"prompt": "x", "max_tokens": 1}
            cases["stop strings"] = {"prompt": self.prompt("x"), "max_tokens": 1, "stop": ["x"]}
        for what, body in cases.items():
            r = self.http.post("/v1/completions", json={"model": self.model, **body})
            assert r.status_code in (400, 413), f"{what}: HTTP {r.status_code}"
            assert "error" in r.json(), f"{what}: no OpenAI error body"
        body = {
            "model": self.model,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
            ],
        }
        r = self.http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, f"bad image: HTTP {r.status_code}"
        assert _error_code(r) != "no_tokenizer", "bad image: refused for the missing tokenizer, not for the image"
        return f"{', '.join(cases)}, bad image -> 400 with an error body"

    def check_cancel(self) -> str:
        """A stream left early: after the server's disconnect grace its request is cancelled and
        decode gives its blocks back. The workers' metrics are their heartbeats' snapshots, so the
        blocks are first seen in use (a stale reading cannot pass) and the wait covers the grace."""
        blocks = lambda: self.metric("dayzero_kv_blocks_used", stage="decode")  # noqa: E731
        baseline = blocks()
        for _ in range(2):  # over a heartbeat or two: an earlier check's request may still show
            time.sleep(0.5)
            baseline = min(baseline, blocks())
        body = {"model": self.model, "prompt": self.prompt("go on"), "max_tokens": 2000, "stream": True}
        body["ignore_eos"] = True
        with self.http.stream("POST", "/v1/completions", json=body) as r:
            events, since = (line for line in self.lines(r) if line.startswith("id:")), time.perf_counter()
            while blocks() <= baseline:  # read on meanwhile: the stream flows
                assert next(events, None) is not None, "the stream ended before decode's blocks showed it"
                assert time.perf_counter() - since < CANCEL_WAIT_S, "decode's blocks never showed the request"
        left = time.perf_counter()
        while time.perf_counter() - left < CANCEL_WAIT_S:
            time.sleep(0.25)
            if blocks() <= baseline:
                return f"blocks back to baseline {time.perf_counter() - left:.1f} s after the disconnect"
        raise AssertionError(f"decode blocks did not return to baseline within {CANCEL_WAIT_S:.0f} s of a disconnect")

    def run(self) -> list[Check]:
        checks: list[tuple[str, Callable[[], str]]] = [
            ("gateway ready", self.check_ready),
            ("weights checked", self.check_weights),
            ("queue, prefill, decode", self.check_queue_prefill_decode),
            ("text and image paths", self.check_paths),
            ("stop, EOS, max tokens", self.check_endings),
            ("bad input refused", self.check_refusals),
            ("cancel frees blocks", self.check_cancel),
        ]
        results = []
        for name, fn in checks:
            start = time.perf_counter()
            try:
                detail = fn()
                results.append(Check(name, "pass", time.perf_counter() - start, detail))
            except SkipCheck as exc:
                results.append(Check(name, "skip", time.perf_counter() - start, str(exc)))
            except (AssertionError, httpx.HTTPError, KeyError, ValueError, json.JSONDecodeError) as exc:
                detail = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
                results.append(Check(name, "fail", time.perf_counter() - start, " ".join(detail.split())))
            if name == "gateway ready" and results[-1].status == "fail":
                break  # nothing else can pass
        return results


class SkipCheck(Exception):
    """The deployment does not have the feature the check needs."""


def _error_code(r: httpx.Response) -> str | None:
    """An OpenAI error body's code (None: not one)."""
    try:
        return r.json()["error"].get("code")
    except (ValueError, LookupError, TypeError, AttributeError):
        return None


def _tiny_png() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 60, 20)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def report(results: list[Check], as_json: bool) -> str:
    if as_json:
        return json.dumps({"ok": all(r.status != "fail" for r in results), "checks": [asdict(r) for r in results]})
    return "\n".join(f"{r.status.upper():4} {r.name:<24} {r.seconds * 1e3:7.0f} ms  {r.detail}" for r in results)
