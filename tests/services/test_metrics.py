"""One scrape of the gateway shows every documented metric, from the gateway and the workers."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from .conftest import MODEL, data_url

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


SPECULATIVE = "dayzero_spec_decode_"  # only a speculating decode worker has these


def _documented() -> list[str]:
    return re.findall(r"^\| `(dayzero_[a-z_]+)` \|", DOCS.read_text(), flags=re.MULTILINE)


def test_documented_names_are_scraped_from_a_running_stack(stack):
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(30, 30, 9)}}]
    httpx.post(
        f"{stack.url}/v1/chat/completions",
        timeout=60,
        json={"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 3},
    )
    httpx.post(f"{stack.url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30)  # a 400
    time.sleep(1.0)  # a heartbeat publishes the workers' snapshots
    text = httpx.get(f"{stack.url}/metrics", timeout=30).text
    names = [n for n in _documented() if not n.startswith(SPECULATIVE)]  # see test_speculative_decode
    assert len(names) >= 25
    missing = [n for n in names if not re.search(rf"^{n}(_bucket|_count|_sum|_total)?[{{ ]", text, re.MULTILINE)]
    assert not missing, missing
    for stage in ("vision", "prefill", "decode"):
        assert f'stage="{stage}"' in text
    assert re.search(r'dayzero_kv_blocks_total\{[^}]*pool="compressed_csa"[^}]*\} [1-9]', text)
    assert re.search(r"dayzero_encoder_cache_misses_total\{[^}]*\} [1-9]", text)
