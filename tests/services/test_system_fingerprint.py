"""OpenAI's ``system_fingerprint`` names the backend a reply came from: a seed draws the same only
while it stays the same. So it must change with the checkpoint's config, and stay one value across
the requests of a stack, whichever decode worker serves them, and across a gateway's restarts (a
process-salted hash, Python's ``hash()``, would differ per process)."""

from __future__ import annotations

import hashlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

import httpx
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, USAGE, chat


def _fingerprint_of(checkpoint, redis_url, speculative_tokens: int = 0) -> str:
    """The fingerprint a gateway started on ``checkpoint`` writes in a reply (a refused one: no workers)."""
    settings = Settings(checkpoint=checkpoint, redis_url=redis_url, speculative_tokens=speculative_tokens)
    with TestClient(make_app(settings)) as gateway:
        return gateway.app.state.gateway.fingerprint


def test_the_fingerprint_changes_with_the_checkpoints_config(demo_dir, redis_url, tmp_path):
    same, changed = tmp_path / "same", tmp_path / "changed"
    shutil.copytree(demo_dir, same)
    shutil.copytree(demo_dir, changed)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, "routed_scaling_factor": 2.5}))
    original = _fingerprint_of(demo_dir, redis_url)
    assert original.startswith("fp_") and len(original) == 15, original
    assert _fingerprint_of(same, redis_url) == original  # the weights' place is not the backend
    assert _fingerprint_of(changed, redis_url) != original


def test_the_fingerprint_changes_with_the_drafts_per_step(demo_dir, redis_url):
    """A stack speculating (DAYZERO_SPECULATIVE_TOKENS 1 or 2) draws otherwise for a seed than one
    that does not: the built-in model, "The for statement is used to", temperature 0.8, seed 7, 30
    tokens gave " represents of the following\ntype as omitted ..." speculating 2 and " represents of
    the module bytrationalize ..." not, under one fingerprint. So each count has its own."""
    fingerprints = {_fingerprint_of(demo_dir, redis_url, drafts) for drafts in (0, 1, 2)}
    assert len(fingerprints) == 3, fingerprints


def test_a_gateway_that_never_drafts_keeps_the_fingerprint_it_had_before_drafts_were_hashed(demo_dir, redis_url):
    """Before the drafts per step were hashed (7d09c5f) the fingerprint was sha256 of the JSON of
    [dayzero's version, config.json] (sorted keys), its first 12 hex digits after "fp_"; a gateway on
    0 drafts draws as it did then, so a client comparing fingerprints must see the same backend."""
    config = json.loads((demo_dir / "config.json").read_text())
    backend = json.dumps([version("dayzero"), config], sort_keys=True)
    before = "fp_" + hashlib.sha256(backend.encode()).hexdigest()[:12]
    assert _fingerprint_of(demo_dir, redis_url, speculative_tokens=0) == before


def _fingerprints(url: str, body: dict, route: str) -> set[str]:
    """Every system_fingerprint a reply carries (each chunk's, in a stream)."""
    if not body.get("stream"):
        r = httpx.post(f"{url}{route}", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return {r.json()["system_fingerprint"]}
    with httpx.stream("POST", f"{url}{route}", json=body, timeout=120) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    return {json.loads(e)["system_fingerprint"] for e in events[:-1]}


def test_one_stack_names_one_backend(stack, demo_dir, redis_url):
    """Bodies and every chunk of streams, chat and completions, sent at once so that both decode
    workers serve some: one fingerprint, the one a gateway started in this process on the same
    checkpoint writes (the stack's gateway is another process)."""
    asks = [(chat(f"Hi {i}", max_tokens=3), "/v1/chat/completions") for i in range(4)]
    asks += [({**chat("Hey", max_tokens=3), "stream": True, **USAGE}, "/v1/chat/completions")]
    asks += [({"model": MODEL, "prompt": "Once", "max_tokens": 3, "n": 2, "stream": True}, "/v1/completions")]
    asks += [({"model": MODEL, "prompt": "Twice", "max_tokens": 3}, "/v1/completions")]
    with ThreadPoolExecutor(len(asks)) as pool:
        seen = set().union(*pool.map(lambda ask: _fingerprints(stack.url, *ask), asks))
    assert seen == {_fingerprint_of(demo_dir, redis_url)}, seen
