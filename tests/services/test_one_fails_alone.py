"""A request whose own sampling fails at run time settles alone: its batch goes on unchanged.

The prefill and decode loops run in-process against a real Redis and a real runtime; the
state crosses from one to the other through the Redis handoff. The poisoned request carries
a grammar that llguidance refuses: valid by the sampling contract, it fails only when a stage
builds the request's sampler. The six others must stream exactly the tokens dayzero's in-process
engine produces for them alone.
"""

from __future__ import annotations

import time

from dayzero import speculative
from dayzero.params import Grammar, SamplingParams
from dayzero.sampling import sample
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import prompt_ids, recording, run_jobs
from .in_process import engine_steps

TOKENS = 6
POISON = SamplingParams(max_tokens=TOKENS, ignore_eos=True, grammar=Grammar("start: %%% not lark"))


def _requests(store: Lifecycle, poisoned: int) -> list[GenerationRequest]:
    out = []
    for i in range(7):
        sampling = POISON if i == poisoned else SamplingParams(max_tokens=TOKENS, ignore_eos=True)
        request = GenerationRequest(
            request_id=f"r{poisoned}-{i}", prompt_ids=tuple(prompt_ids(i)), sampling=sampling, created=time.time()
        )
        store.admit(request, [], "", 60)
        out.append(request)
    return out


def _expected(demo_dir, request: GenerationRequest) -> list[int]:
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    return [s.token for s in engine_steps(demo_dir, list(request.prompt_ids), params)]


def _last_error(store: Lifecycle, rid: str) -> bytes:
    (_, last), *_ = store.r.xrevrange(f"dz:tokens:{rid}", count=1)
    return last.get(b"e", b"")


def test_a_poisoned_request_fails_alone_in_prefill_and_in_decode(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    prefill_rt = Runtime.load(settings, "prefill9@test", "prefill", False)
    decode_rt = Runtime.load(settings, "decode9@test", "decode", False)

    # prefill: request 3 fails its first sample; the six others are handed to decode
    sent: list[DecodeJob] = []
    batch = _requests(store, poisoned=3)
    run_jobs(PrefillLoop(prefill_rt, recording(sent)), [PrefillJob(request=r) for r in batch])
    assert sorted(j.request.request_id for j in sent) == sorted(r.request_id for i, r in enumerate(batch) if i != 3)
    assert store.done("r3-3") == "error" and _last_error(store, "r3-3") == b"failed after prefill: ValueError"
    assert prefill_rt.pools.sequences == {}  # the redis handoff released the six; the failure freed its own

    # decode: the same six plus one whose sampling breaks only now (its first token came from prefill)
    ok = [j for j in sent if j.request.request_id != "r3-5"]
    spoiled = next(j for j in sent if j.request.request_id == "r3-5")
    spoiled = spoiled.model_copy(update={"request": spoiled.request.model_copy(update={"sampling": POISON})})
    run_jobs(DecodeLoop(decode_rt), [*ok, spoiled])
    assert store.done("r3-5") == "error" and _last_error(store, "r3-5") == b"sampling failed: ValueError"
    assert len(store.streamed_tokens("r3-5")) == 1  # the prefill token, then the error event
    for job in ok:
        rid = job.request.request_id
        assert store.done(rid) == "length" and store.streamed_tokens(rid) == _expected(demo_dir, job.request), rid
    assert decode_rt.pools.sequences == {}


def test_a_speculative_round_that_fails_midway_streams_its_kept_tokens_in_place(demo_dir, redis_url, monkeypatch):
    """Speculation: both drafts kept, then the bonus row's logits are NaN (a NaN born in the last
    layer stays in its row). As plain decoding's, the stream holds every token up to the failure,
    each at its own index, then the error; the kept tokens were appended one index early (the first
    dropped as a replay of the prefill's, the second in its place)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", speculative_tokens=2)
    store = Lifecycle.connect(redis_url)
    prefill_rt = Runtime.load(settings, "prefill8@test", "prefill", False)
    decode_rt = Runtime.load(settings, "decode8@test", "decode", False)
    (request,) = _requests(store, poisoned=-1)[:1]
    expected = _expected(demo_dir, request)
    sent: list[DecodeJob] = []
    run_jobs(PrefillLoop(prefill_rt, recording(sent)), [PrefillJob(request=request)])
    monkeypatch.setattr(speculative, "sample", lambda logits, *args: sample(logits * float("nan"), *args))
    loop = DecodeLoop(decode_rt)
    loop.speculation = speculative.Speculation(2, lambda ids, drafts: [expected[1:3]])  # the true continuation
    run_jobs(loop, sent)
    rid = request.request_id
    assert store.done(rid) == "error" and _last_error(store, rid) == b"sampling failed: ValueError"
    assert store.streamed_tokens(rid) == expected[:3]
