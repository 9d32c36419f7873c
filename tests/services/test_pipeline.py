"""End to end through real HTTP, a real Redis and real worker processes (1 prefill, 2 decode)."""

from __future__ import annotations

import concurrent.futures as futures
import json

import httpx
import pytest
import redis
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.sampling import SamplingParams
from dayzero.tokenizer import TextCodec

from .conftest import (
    MODEL,
    chat,
    data_url,
    engine_completer,
    engine_steps,
    prompt_ids,
    sse_events,
    stream_text,
    wait_until,
)


@pytest.fixture(scope="module")
def reference(demo_dir):
    """The same checkpoint run in-process by dayzero's engine (no queue, no handoff)."""
    return engine_completer(demo_dir, "cpu")


def test_completion_equals_in_process_engine(stack, reference):
    ids = prompt_ids(1)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["text"] == reference(ids, 24)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 24, "total_tokens": len(ids) + 24}


def test_penalties_reach_the_sampler(stack, reference):
    ids, penalties = prompt_ids(2), {"presence_penalty": 1.5, "frequency_penalty": 0.7}
    body = {"model": MODEL, "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True, **penalties}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == reference(ids, 16, **penalties)


def test_logprobs_in_bodies_and_streams_match_the_engine(stack, demo_dir):
    ids = prompt_ids(3)
    steps = engine_steps(demo_dir, ids, SamplingParams(max_tokens=10, ignore_eos=True, logprobs=2))
    body = {"model": MODEL, "prompt": ids, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    served = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    assert len(served["token_logprobs"]) == 10 and len(served["top_logprobs"]) == 10
    assert max(abs(a - s.logprob) for a, s in zip(served["token_logprobs"], steps, strict=True)) < 1e-4
    assert all(len(top) <= 2 for top in served["top_logprobs"])
    assert served["text_offset"][0] == 0 and served["text_offset"] == sorted(served["text_offset"])

    chat_body = chat("The quick brown fox", max_tokens=10, ignore_eos=True, logprobs=True, top_logprobs=2)
    streamed = []
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**chat_body, "stream": True}) as r:
        for _, data in sse_events(r):
            if data != "[DONE]":
                streamed += (data["choices"][0].get("logprobs") or {"content": []})["content"]
    whole = httpx.post(f"{stack.url}/v1/chat/completions", json=chat_body, timeout=60).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == len(streamed) == 10
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in content]  # same greedy run, same numbers
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)


def test_echo_returns_the_prompt_and_its_logprobs(stack, demo_dir):
    from dayzero.model.forward import score

    model, codec = load_model(demo_dir, progress=False), TextCodec.from_checkpoint(demo_dir)
    ids = prompt_ids(4)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    choice = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(codec.decode(ids))
    assert len(logprobs["tokens"]) == len(ids) + 1 and logprobs["token_logprobs"][0] is None
    full = torch.log_softmax(score(model, pools_for(model.cfg, torch.float32, len(ids)), "s", ids), dim=-1)
    want = [full[t, ids[t + 1]].item() for t in range(len(ids) - 1)]  # the full forward, independently
    assert max(abs(a - b) for a, b in zip(logprobs["token_logprobs"][1 : len(ids)], want, strict=True)) < 1e-4
    assert logprobs["top_logprobs"][0] is None and all(len(t) == 1 for t in logprobs["top_logprobs"][1:])

    plain = {**body, "logprobs": None, "stream": True}
    text, _, _ = stream_text(f"{stack.url}/v1/completions", plain)
    assert text.startswith(codec.decode(ids)) and len(text) > len(codec.decode(ids)) - 1


def test_several_prompts_and_n_give_one_choice_each_in_order(stack, reference):
    prompts = [prompt_ids(5), prompt_ids(6)]
    body = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in out["choices"]] == [reference(p, 6) for p in prompts for _ in range(2)]
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts)) and out["usage"]["completion_tokens"] == 24
    assert len(r.headers["x-request-id"].split(",")) == 4

    sampled = chat("tell me", max_tokens=8, ignore_eos=True, n=3, temperature=1.0, seed=7)
    choices = httpx.post(f"{stack.url}/v1/chat/completions", json=sampled, timeout=120).json()["choices"]
    assert len({c["message"]["content"] for c in choices}) > 1  # seeds 7, 8, 9: different draws


def test_several_choices_stream_together_and_leaving_cancels_them_all(stack, reference):
    prompts = [prompt_ids(7), prompt_ids(8)]
    body = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    texts, finished = {}, set()
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        events = list(sse_events(r))
    assert events[-1][1] == "[DONE]" and all(event_id is None for event_id, _ in events)
    for _, data in events[:-1]:
        choice = data["choices"][0]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert finished == {0, 1, 2, 3}
    assert [texts[i] for i in range(4)] == [reference(p, 6) for p in prompts for _ in range(2)]

    r = redis.Redis.from_url(stack.redis_url)
    long = chat("go on", max_tokens=2000, ignore_eos=True, n=3, stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=long, timeout=60) as response:
        ids = response.headers["x-request-id"].split(",")
        for seen, _ in enumerate(sse_events(response)):
            if seen >= 6:
                break  # the client leaves
    assert len(ids) == 3
    assert wait_until(lambda: all(r.get(f"dz:done:{rid}") == b"cancelled" for rid in ids), 5.0)


def test_chat_stream_and_body_agree(stack):
    body = chat("The quick brown fox", max_tokens=16, ignore_eos=True)
    whole = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60).json()
    text, ids, final = stream_text(f"{stack.url}/v1/chat/completions", body)
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    assert text == whole["choices"][0]["message"]["content"]
    assert final["object"] == "chat.completion.chunk" and final["usage"]["completion_tokens"] == 16
    numbers = [int(i.split("-")[0]) for i in ids]
    assert numbers == sorted(set(numbers)) and numbers[-1] == 16  # ids are token indices + 1


def test_sixteen_concurrent_streams_on_two_decode_workers(stack, reference):
    def one(i: int):
        body = {"model": MODEL, "prompt": prompt_ids(i), "max_tokens": 12 + i, "temperature": 0, "ignore_eos": True}
        return stream_text(f"{stack.url}/v1/completions", body)

    with futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    for i, (text, _, final) in enumerate(results):
        assert final["usage"]["completion_tokens"] == 12 + i
        assert text == reference(prompt_ids(i), 12 + i)
    import redis

    workers = redis.Redis.from_url(stack.redis_url).hgetall("dz:workers:decode")
    assert len(workers) == 2


def test_resume_with_last_event_id_gives_exactly_the_rest(stack):
    body = chat("resume me", max_tokens=20, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        rid = r.headers["x-request-id"]
        events = [(i, d) for i, d in sse_events(r)]
    full = {i: d for i, d in events if i}
    ids = list(full)
    cut = ids[len(ids) // 2]
    resumed = []
    with httpx.stream("GET", f"{stack.url}/v1/requests/{rid}/stream", headers={"Last-Event-ID": cut}, timeout=60) as r:
        for event_id, data in sse_events(r):
            if data == "[DONE]":
                break
            resumed.append(event_id)
            assert data["choices"] == full[event_id]["choices"]
    assert resumed == ids[ids.index(cut) + 1 :]


def test_resume_in_flight_after_a_disconnect(stack):
    body = chat("keep going", max_tokens=400, ignore_eos=True, stream=True)
    seen = []
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        rid = r.headers["x-request-id"]
        for event_id, _ in sse_events(r):
            if event_id:
                seen.append(event_id)
            if len(seen) == 3:
                break  # the client drops the connection mid-stream ...
    rest = []  # ... and reconnects at once, inside the grace period
    with httpx.stream(
        "GET", f"{stack.url}/v1/requests/{rid}/stream", headers={"Last-Event-ID": seen[-1]}, timeout=120
    ) as r:
        for event_id, data in sse_events(r):
            if data == "[DONE]":
                break
            rest.append((event_id, data))
    assert rest[-1][1]["choices"][0]["finish_reason"] == "length"
    numbers = [int(i.split("-")[0]) for i in seen + [e for e, _ in rest]]
    assert numbers == sorted(set(numbers))  # no duplicates, in order


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (chat("x", model="other"), 400, "model"),
        (chat("x", temperature=5), 400, "temperature"),
        (chat("x", max_tokens=0), 400, "max_tokens"),
        (chat("x", max_tokens=100_000), 400, "max_tokens"),
        (chat("x", n=9), 400, "n"),
        ({"model": MODEL, "prompt": ["a"] * 33}, 400, "prompt"),
        (chat("x", stop=["a"] * 1 + [""]), 400, "stop.1"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400, None),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, None),
        ({"model": MODEL, "prompt": [0, 99999]}, 400, "prompt"),
        (chat("x", tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
        (chat("x", tool_choice="required"), 400, "tool_choice"),
        (chat("x", response_format={"type": "json_object"}), 400, "response_format"),
        (chat("x", top_logprobs=3), 400, "top_logprobs"),  # without logprobs: true
        (chat("x", logprobs=True, top_logprobs=21), 400, "top_logprobs"),
        ({"model": MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs"),
        (chat("x", presence_penalty=3), 400, "presence_penalty"),
        (chat("x", echo=True), 400, "echo"),
        ({"model": MODEL, "prompt": "x", "best_of": 3}, 400, "best_of"),
        ({"model": MODEL, "prompt": "word " * 5000}, 400, "messages"),
        (
            {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                    }
                ],
            },
            400,
            "messages.0.content",
        ),
    ],
)
def test_bad_requests_get_openai_errors(stack, body, status, param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = httpx.post(f"{stack.url}{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param


def test_malformed_and_oversized_bodies(stack):
    r = httpx.post(
        f"{stack.url}/v1/chat/completions",
        content=b"{not json",
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "error" in r.json()
    big = json.dumps(chat("y" * 70_000)).encode()
    r = httpx.post(
        f"{stack.url}/v1/chat/completions", content=big, timeout=30, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_models_health_ready_metrics_and_openapi(stack):
    assert httpx.get(f"{stack.url}/v1/models").json()["data"][0]["id"] == MODEL
    assert httpx.get(f"{stack.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{stack.url}/ready").json()
    assert ready["ready"] and ready["workers"]["decode"] == 2
    metrics = httpx.get(f"{stack.url}/metrics").text
    assert "dayzero_time_to_first_token_seconds_bucket" in metrics
    assert "/v1/chat/completions" in httpx.get(f"{stack.url}/openapi.json").json()["paths"]


def test_text_and_image_request_equals_in_process_multimodal_run(stack, demo_dir):
    from dayzero.completion import Completion
    from dayzero.model.forward import decode, prefill
    from dayzero.settings import Settings
    from dayzero.vision.encoder import VisionEncoder, load_tower, multimodal_prompt
    from services.gateway.images import render_chat
    from services.gateway.schemas import ChatCompletionRequest

    content = [
        {"type": "text", "text": "what is"},
        {"type": "image_url", "image_url": {"url": data_url(60, 45, 1)}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": data_url(30, 90, 2)}},
    ]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    served = r.json()

    settings = Settings()
    model, codec = load_model(demo_dir, progress=False), TextCodec.from_checkpoint(demo_dir)
    encoder = VisionEncoder(load_tower(demo_dir), settings.patch_spec(), settings.image_limits(), 0)
    prompt = render_chat(ChatCompletionRequest(**body).messages, settings.image_limits(), settings.patch_spec(), True)
    ids, embeds = multimodal_prompt(model.embed, codec.chat_ids(prompt.messages), 2, encoder.embeddings(prompt.images))
    assert served["usage"]["prompt_tokens"] == len(ids)  # placeholders expanded to merged patches
    pools = pools_for(model.cfg, torch.float32, len(ids) + 10)
    completion = Completion(codec, SamplingParams(max_tokens=10, ignore_eos=True), (1,), len(ids), 10_000)
    logits, text = prefill(model, pools, ["s"], [ids], embeds=[embeds])[0], []
    for _ in range(10):
        step = completion.accept(int(logits.argmax()))
        text.append(step.text)
        logits = decode(model, pools, ["s"], [step.token])[0]
    assert served["choices"][0]["message"]["content"] == "".join(text)


def test_bad_images_are_refused_with_400(stack):
    def ask(url: str) -> httpx.Response:
        content = [{"type": "image_url", "image_url": {"url": url}}]
        return httpx.post(
            f"{stack.url}/v1/chat/completions",
            timeout=30,
            json={"model": MODEL, "messages": [{"role": "user", "content": content}]},
        )

    for url, code in (
        ("https://example.com/a.png", "invalid_image"),
        ("data:image/png;base64,AAAA", "invalid_image"),
        ("data:image/png;base64,@@", "invalid_image"),
    ):
        r = ask(url)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
