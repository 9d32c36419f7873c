"""The gateway as ``dayzero doctor`` reads it: a client with the operator's API key, greedy
completions, ``/metrics`` samples by label, and a stream's lines within the timeout."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx

READY_WAIT_S = 10.0  # a gateway answers /v1/models and /ready at once: longer means the URL is wrong or it hangs


class GatewayProbe:
    """What a check asks the gateway with (``Doctor``'s checks use it)."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 60) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.root = url.rstrip("/").removesuffix("/v1")  # OpenAI clients' base URL ends in /v1: the same gateway
        self.http = httpx.Client(base_url=self.root, headers=headers, timeout=timeout_s)
        self.ready_wait_s, self.timeout_s = min(timeout_s, READY_WAIT_S), timeout_s
        self.model = ""
        self.tokenizer = True  # False: the server refuses text (no tokenizer.json); prompts are token ids
        self.max_len = 200_000  # the model card's max_model_len

    def prompt(self, text: str) -> str | list[int]:
        """``text``, or token ids standing for it where the server has no tokenizer (low ids: a
        vocabulary's special tokens, BOS and EOS aside, sit at its end)."""
        return text if self.tokenizer else [3 + b % 64 for b in text.encode()]

    def complete(self, **body) -> dict:
        r = self.http.post("/v1/completions", json={"model": self.model, "temperature": 0, **body})
        if r.status_code != 200:
            raise AssertionError(f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include ``labels``."""
        return sum(self.samples(name, **labels))

    def samples(self, name: str, **labels: str) -> list[float]:
        """A metric's samples whose labels include ``labels``."""
        found = []
        for line in self.http.get("/metrics").text.splitlines():
            if not line.startswith(name):
                continue
            match = re.match(rf"{re.escape(name)}(\{{(.*)\}})? ([0-9.eE+-]+)$", line)
            if match and all(f'{k}="{v}"' in (match[2] or "") for k, v in labels.items()):
                found.append(float(match[3]))
        return found

    def lines(self, response: httpx.Response) -> Iterator[str]:
        """A stream's lines until ``timeout_s`` has passed since it began: its keep-alives restart
        httpx's read timeout, so a request waiting on a dead worker would otherwise hold the check."""
        deadline = time.monotonic() + self.timeout_s
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"the stream did not end within {self.timeout_s:g} s (--timeout): a worker down?")
            yield line
