"""Prefill's first token against a real Redis that stops answering as it is appended (SIGSTOP past
the 5 s command timeout): the append raises, yet lands when Redis continues. The request is put back
and prefilled again; its retry must send the same token again (a replay, skipped), not a new sample:
a new sample went to decode while the client had read the first (its text went on after a token the
model never saw)."""

from __future__ import annotations

import signal
import time

import pytest

from dayzero.params import SamplingParams
from dayzero.procs import free_port, start_redis
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of the test's own, to stop: (its process, its url)."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    try:
        yield server, f"redis://127.0.0.1:{port}/0"
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait()


def test_a_first_token_whose_append_timed_out_but_landed_is_the_one_handed_to_decode(demo_dir, own_redis):
    server, url = own_redis
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=url), "prefill-stopped@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop, appends, real_append = PrefillLoop(runtime, recording(sent)), [], runtime.store.append

    def append_as_redis_stops(tokens, *args):
        appends.append([t.token for t in tokens])
        if len(appends) > 1:
            return real_append(tokens, *args)
        runtime.store.r.ping()  # (the connection the append reuses sends no health check first, unanswered)
        server.send_signal(signal.SIGSTOP)
        try:  # stopped past the command timeout: the append raises...
            return real_append(tokens, *args)
        finally:  # ... and lands as Redis continues, before the retry's
            server.send_signal(signal.SIGCONT)

    runtime.store.append = append_as_redis_stops
    runtime.store.load_scripts()  # (as a worker does on starting: else the append lands as an unknown script's)
    store = Lifecycle.connect(url)
    sampling = SamplingParams(max_tokens=4, temperature=2.0)  # unseeded: a new sample is another token
    request = GenerationRequest(request_id="stopped", prompt_ids=(0, 5, 6, 7), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    run_jobs(loop, [PrefillJob(request=request)], 60)
    assert len(appends) == 2  # put back once, prefilled again
    assert store.streamed_tokens("stopped") == appends[0]  # the first try's token landed after all
    assert [list(job.generated) for job in sent] == [appends[0]]  # decode goes on after the token streamed
    assert appends[1] == appends[0]  # sent again, not sampled anew
    runtime.close()
