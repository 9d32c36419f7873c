"""A decode worker that speculates with the MTP layer (DAYZERO_SPECULATIVE_TOKENS=2) gives the
same greedy completions as the plain in-process engine: the MTP layer's window and the last
position's streams travel from prefill to decode with the rest of the attention state."""

from __future__ import annotations

import concurrent.futures as futures
import re

import httpx
import pytest

from .conftest import MODEL, prompt_ids, start_stack, wait_until
from .test_metrics import SPECULATIVE, _documented


@pytest.fixture(scope="module")
def speculating(demo_dir, tmp_path_factory):
    counts = {"vision": 1, "prefill": 1, "decode": 1}  # /ready waits for every stage
    s = start_stack(demo_dir, tmp_path_factory.mktemp("logs"), counts, {"DAYZERO_SPECULATIVE_TOKENS": "2"})
    yield s
    s.stop()


def test_speculative_worker_equals_plain_engine(speculating, reference):
    prompts = [prompt_ids(i) for i in (1, 4, 7)]  # decoded in one batch, at different lengths

    def complete(ids: list[int]) -> dict:
        body = {"model": MODEL, "prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{speculating.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with futures.ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(complete, prompts))
    for ids, out in zip(prompts, outs, strict=True):
        assert out["choices"][0]["text"] == reference(ids, 24)
        assert out["usage"]["completion_tokens"] == 24

    def drafted() -> float:
        lines = httpx.get(f"{speculating.url}/metrics").text.splitlines()
        found = [line for line in lines if line.startswith("dayzero_spec_decode_num_draft_tokens_total")]
        return float(found[0].rsplit(" ", 1)[1]) if found else 0.0

    assert wait_until(drafted, timeout_s=10) > 0  # the worker's snapshot rides on its heartbeat
    text = httpx.get(f"{speculating.url}/metrics").text
    for name in (n for n in _documented() if n.startswith(SPECULATIVE)):
        assert re.search(rf"^{name}(_total)?[{{ ]", text, re.MULTILINE), name
