"""Image tokens in the sequence: splice, batching without mixing, the encoder cache."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill
from dayzero.settings import Settings
from dayzero.vision.encoder import VisionEncoder, load_tower, multimodal_prompt
from dayzero.vision.images import decode, expand
from dayzero.vision.preprocess import process
from dayzero.vision.tower import encode

from .conftest import encoded

IMAGE = 2


@pytest.fixture(scope="module")
def parts(vision_checkpoint):
    settings = Settings()
    model = load_model(vision_checkpoint, progress=False)
    encoder = VisionEncoder(load_tower(vision_checkpoint), settings.patch_spec(), settings.image_limits(), 1 << 20)
    return model, encoder


def _run(model, prompts, embeds):
    pools = pools_for(model.cfg, torch.float32, max(len(p) for p in prompts), max_sequences=len(prompts))
    return prefill(model, pools, [f"s{i}" for i in range(len(prompts))], prompts, embeds=embeds)


def test_image_run_equals_injected_embeddings(parts):
    model, encoder = parts
    images = [encoded(50, 70, seed=1), encoded(90, 30, seed=2)]
    ids = [0, 5, 6, IMAGE, 7, 8, IMAGE, 9]  # two images between text
    feats = encoder.embeddings(images)
    expanded, embeds = multimodal_prompt(model.embed, ids, IMAGE, feats)
    assert len(expanded) == len(ids) - 2 + sum(f.shape[0] for f in feats)
    got = _run(model, [expanded], [embeds])
    # the same embeddings computed on their own (no cache, no splice helper) and injected by hand
    pixels, grid = process([decode(d, encoder.limits) for d in images], encoder.spec)
    separately = encode(encoder.tower, pixels, grid)
    manual = model.embed(torch.tensor(expanded)).clone()
    rows = [i for i, t in enumerate(expanded) if t == IMAGE]
    manual[rows] = separately
    assert torch.allclose(got, _run(model, [expanded], [manual]), atol=1e-6)
    text_only = _run(model, [expanded], None)  # the placeholder embeddings instead: the image matters
    assert (got - text_only).abs().max() > 1e-4


def test_text_only_never_touches_the_tower_and_cache_skips_it(parts):
    model, encoder = parts
    calls = encoder.counters.tower_calls
    _run(model, [[0, 5, 6, 7]], None)
    assert encoder.counters.tower_calls == calls
    image = encoded(40, 40, seed=5)
    first = encoder.embeddings([image])[0]
    calls, hits = encoder.counters.tower_calls, encoder.counters.hits
    again = encoder.embeddings([image])[0]
    assert encoder.counters.tower_calls == calls and encoder.counters.hits == hits + 1
    assert torch.equal(first, again)


def test_two_requests_with_different_images_in_one_batch_do_not_mix(parts):
    model, encoder = parts
    prompts, embeds = [], []
    for seed, size in ((11, (60, 60)), (12, (100, 40))):
        feats = encoder.embeddings([encoded(*size, seed=seed)])
        ids, emb = multimodal_prompt(model.embed, [0, 4, IMAGE, 5], IMAGE, feats)
        prompts.append(ids)
        embeds.append(emb)
    together = _run(model, prompts, embeds)
    for i in range(2):
        alone = _run(model, [prompts[i]], [embeds[i]])
        assert torch.allclose(together[i], alone[0], atol=1e-5)


def test_placeholder_count_must_match_images():
    with pytest.raises(ValueError, match="2 image placeholders for 1 images"):
        expand([IMAGE, 3, IMAGE], IMAGE, [4])


def test_the_warm_up_runs_the_tower_and_leaves_the_cache_and_counters_alone(parts, monkeypatch):
    import dayzero.vision.encoder as module

    _, encoder = parts
    seen = []
    monkeypatch.setattr(module, "encode", lambda *args: seen.append(args[1].shape) or encode(*args))
    before, cached = asdict(encoder.counters), len(encoder._cache)
    encoder.warm_up()
    assert seen and asdict(encoder.counters) == before and len(encoder._cache) == cached
