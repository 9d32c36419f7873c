"""A decode worker that speculates with the MTP layer (DAYZERO_SPECULATIVE_TOKENS=2) gives the
same greedy completions as the plain in-process engine: the MTP layer's window and the last
position's streams travel from prefill to decode with the rest of the attention state. It serves
the shipped trained model, whose drafts are kept about half the time, so the request features
cross rounds that keep several tokens."""

from __future__ import annotations

import concurrent.futures as futures
import re

import httpx
import pytest

from dayzero.sampling import SamplingParams
from dayzero.settings import BUILT_IN_MODEL
from dayzero.tokenizer import load_codec

from .conftest import MODEL, prompt_ids, start_stack, stream_killing_its_worker, wait_until
from .in_process import engine_completer, engine_steps
from .test_metrics import SPECULATIVE, _documented

LOGPROB_TOL = 1e-4  # a verify row's fp32 logits against a one-token decode step's: ~1e-5 measured


@pytest.fixture(scope="module")
def speculating(tmp_path_factory):
    counts = {"vision": 1, "prefill": 1, "decode": 1}  # /ready waits for every stage
    s = start_stack(BUILT_IN_MODEL, tmp_path_factory.mktemp("logs"), counts, {"DAYZERO_SPECULATIVE_TOKENS": "2"})
    yield s
    s.stop()


def _complete(stack, body: dict) -> dict:
    r = httpx.post(f"{stack.url}/v1/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_speculative_worker_equals_plain_engine(speculating):
    prompts = [prompt_ids(i) for i in (1, 4, 7)]  # decoded in one batch, at different lengths
    reference = engine_completer(BUILT_IN_MODEL, "cpu")
    body = {"max_tokens": 24, "ignore_eos": True}
    with futures.ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda ids: _complete(speculating, {"prompt": ids, **body}), prompts))
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


FEATURES = [  # (body, the same sampling in-process)
    ({"max_tokens": 13, "logprobs": 2, "ignore_eos": True}, SamplingParams(max_tokens=13, logprobs=2, ignore_eos=True)),
    ({"max_tokens": 40, "stop": [" the"]}, SamplingParams(max_tokens=40, stop=(" the",))),
    (
        {"max_tokens": 30, "presence_penalty": 1.5, "frequency_penalty": 0.7, "ignore_eos": True},
        SamplingParams(max_tokens=30, presence_penalty=1.5, frequency_penalty=0.7, ignore_eos=True),
    ),
    ({"max_tokens": 60, "logit_bias": {"1": 6}}, SamplingParams(max_tokens=60, logit_bias=((1, 6.0),))),  # EOS
    ({"max_tokens": 9, "n": 2, "ignore_eos": True}, SamplingParams(max_tokens=9, ignore_eos=True)),
]


def test_speculative_worker_serves_each_feature_as_plain_decoding(speculating):
    """Greedy requests with logprobs, a stop string, penalties, an EOS made likely, n = 2, in one
    batch: each choice's text, finish, token count and logprobs are the non-speculative engine's."""
    codec = load_codec(BUILT_IN_MODEL)
    prompts = ["The for statement is used to", "Lists are mutable sequences", "The import statement"]
    cases = [(p, body, params) for p in prompts for body, params in FEATURES]
    with futures.ThreadPoolExecutor(len(cases)) as pool:
        outs = list(pool.map(lambda c: _complete(speculating, {"prompt": c[0], **c[1]}), cases))
    finishes = set()
    for (prompt, body, params), out in zip(cases, outs, strict=True):
        steps = engine_steps(BUILT_IN_MODEL, codec.encode(prompt), params)
        for choice in out["choices"]:
            assert choice["text"] == "".join(s.text for s in steps), (prompt, body)
            assert choice["finish_reason"] == steps[-1].finish_reason, (prompt, body)
            finishes.add(choice["finish_reason"])
            if params.logprobs is not None:
                served = choice["logprobs"]["token_logprobs"]
                assert len(served) == len(steps)
                assert max(abs(a - s.logprob) for a, s in zip(served, steps, strict=True)) < LOGPROB_TOL
        assert out["usage"]["completion_tokens"] == len(steps) * body.get("n", 1)
    assert finishes == {"stop", "length"}


@pytest.mark.slow
def test_a_seeded_stream_re_run_after_its_decode_worker_died_continues_as_undisturbed(speculating):
    """A seeded sampled stream whose speculating decode worker is SIGKILLed mid-stream is re-run from
    the tokens it streamed and goes on with the very tokens of the same request undisturbed (was: a
    plain draw for its next token, from another generator: other text). A greedy stream and
    an unseeded sampled one that the worker took down with it finish too, without gaps; the greedy
    one as undisturbed."""
    body = {"model": MODEL, "prompt": "Lists are mutable sequences", "max_tokens": 80, "ignore_eos": True}
    seeded, greedy, unseeded = {**body, "temperature": 0.9, "seed": 42}, {**body, "temperature": 0}, body
    with futures.ThreadPoolExecutor(2) as pool:
        alone = [pool.submit(stream_killing_its_worker, speculating, b, None) for b in (seeded, greedy)]
        undisturbed, greedy_undisturbed = (f.result()[:2] for f in alone)
        others = [pool.submit(stream_killing_its_worker, speculating, b, None) for b in (greedy, unseeded)]
        *re_run, killed = stream_killing_its_worker(speculating, seeded, after=8, back=True)
        re_run_greedy, re_run_unseeded = (f.result()[:2] for f in others)
    assert killed is not None and killed.name == "decode0"
    # the text, and the last index (the chunks' other bounds are the gateway's: what arrived together
    # while it lagged is one chunk, event_streams.py; under load a re-run's first chunk held tokens 1-2)
    assert (re_run[0], re_run[1][-1]) == (undisturbed[0], undisturbed[1][-1])
    assert len(undisturbed[1]) > 8 and undisturbed[1][-1] == 80
    assert (re_run_greedy[0], re_run_greedy[1][-1]) == (greedy_undisturbed[0], greedy_undisturbed[1][-1])
    assert re_run_unseeded[1] == sorted(set(re_run_unseeded[1])) and re_run_unseeded[1][-1] == 80
