"""A request that no live worker takes ends within DAYZERO_NO_WORKER_TIMEOUT_S, and one waiting behind
others on a live worker waits on. Real processes: a frozen (SIGSTOPped) worker is continued at the end."""

from __future__ import annotations

import concurrent.futures as futures
import signal

import httpx
import redis
from tokenizers import Tokenizer

from dayzero.serving.no_worker_count import unserved_for

from .conftest import MODEL, sse_events, start_stack, stream_text, wait_until

NO_WORKER = {"DAYZERO_NO_WORKER_TIMEOUT_S": "2", "DAYZERO_MAX_BATCH": "2"}


def _stream_ending(url: str, body: dict) -> tuple[list, dict, str]:
    """The text chunks of a stream, its last two payloads (the error event and [DONE])."""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        payloads = [data for _, data in sse_events(r)]
    return payloads[:-2], payloads[-2], payloads[-1]


def test_a_request_no_live_worker_takes_ends_with_503_and_those_behind_a_live_one_wait(text_dir, tmp_path):
    """With its stage's only worker frozen a request waited: at decode's handoff for 4 handoff
    timeouts (~244 s), queued for prefill until the task time limit (an hour). Now the gateway ends
    it once the stage has had no live worker for the bound: 503 ``no_worker``, or a stream's error
    event and [DONE]. Six streams on a decode batch of two wait past the bound behind each other
    on live workers, and finish."""
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, NO_WORKER)
    prefill, decode = stack.child("prefill0").proc, stack.child("decode0").proc
    try:
        body = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 60, "ignore_eos": True}
        with futures.ThreadPoolExecutor(6) as pool:
            done = list(pool.map(lambda _: stream_text(f"{stack.url}/v1/completions", body), range(6)))
        assert [final["choices"][0]["finish_reason"] for _, _, final, _ in done] == ["length"] * 6

        prefill.send_signal(signal.SIGSTOP)
        refused = httpx.post(f"{stack.url}/v1/completions", json={**body, "max_tokens": 4}, timeout=30)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "no_worker" and error["type"] == "service_unavailable" and error["param"] is None
        assert "no prefill worker" in error["message"] and "DAYZERO_NO_WORKER_TIMEOUT_S=2" in error["message"]
        queued = redis.Redis.from_url(stack.redis_url).llen("prefill")  # the ended request's message stays
        for _ in range(3):  # refused at once: queued, each would wait for the next pass and fill the queue
            again = httpx.post(f"{stack.url}/v1/completions", json={**body, "max_tokens": 4}, timeout=30)
            assert again.status_code == 503 and again.json()["error"]["code"] == "no_worker"
        assert redis.Redis.from_url(stack.redis_url).llen("prefill") == queued
        prefill.send_signal(signal.SIGCONT)  # live again at its next stamp (a request sent before it: 503)
        assert wait_until(lambda: unserved_for(redis.Redis.from_url(stack.redis_url), "prefill") == 0.0, 10)

        decode.send_signal(signal.SIGSTOP)  # prefill streams the first token, then hands off to nobody
        # (a whole character, sent at once: greedy's first token here has no text of its own, its chunk waits
        # for the next token, which came only when the frozen worker's pending read took the handoff)
        whole = {Tokenizer.from_file(str(text_dir / "tokenizer.json")).token_to_id("C"): 100}
        chunks, ended, last = _stream_ending(stack.url, {**body, "logit_bias": whole})
        # (a second token when the frozen worker's pending BRPOP took the message: the reaper re-ran it)
        assert 1 <= len(chunks) < 60 and chunks[0]["choices"][0]["text"], (chunks, ended)
        assert ended["error"]["code"] == "no_worker" and "no decode worker" in ended["error"]["message"]
        assert last == "[DONE]"
    finally:
        prefill.send_signal(signal.SIGCONT)
        decode.send_signal(signal.SIGCONT)
        stack.stop()
