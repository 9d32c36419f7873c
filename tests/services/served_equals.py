"""What a stack at ``url`` serves equals dayzero's engine run in-process on the same checkpoint
(in_process.py: no queue, no handoff): concurrent text streams, and a chat request with images."""

from __future__ import annotations

import httpx

from .conftest import MODEL, USAGE, data_url, prompt_ids, stream_text


def assert_image_request_equals_in_process_run(url: str, checkpoint) -> None:
    """A chat request with text and two images through the stack at ``url``: its greedy text and
    prompt length equal an in-process multimodal run of ``checkpoint`` (tower, splice, model)."""
    import torch

    from dayzero.checkpoint import load_model
    from dayzero.completion import Completion
    from dayzero.kv.pools import pools_for
    from dayzero.model.forward import decode, prefill
    from dayzero.sampling import SamplingParams
    from dayzero.settings import Settings
    from dayzero.tokenizer import TextCodec
    from dayzero.vision.encoder import VisionEncoder, load_tower, multimodal_prompt
    from services.gateway.chat_schemas import ChatCompletionRequest
    from services.gateway.images import render_chat

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
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    served = r.json()

    settings = Settings()
    model, codec = load_model(checkpoint, progress=False), TextCodec.from_checkpoint(checkpoint)
    encoder = VisionEncoder(load_tower(checkpoint), settings.patch_spec(), settings.image_limits(), 0)
    prompt = render_chat(ChatCompletionRequest(**body).messages, settings.image_limits(), settings.patch_spec(), True)
    image = model.cfg.raw["image_token_id"]
    ids, embeds = multimodal_prompt(
        model.embed, codec.chat_ids(prompt.messages), image, encoder.embeddings(prompt.images)
    )
    assert served["usage"]["prompt_tokens"] == len(ids)  # placeholders expanded to merged patches
    pools = pools_for(model.cfg, torch.float32, len(ids) + 10)
    completion = Completion(codec, SamplingParams(max_tokens=10, ignore_eos=True), (1,), len(ids), 10_000)
    logits, text = prefill(model, pools, ["s"], [ids], embeds=[embeds])[0], []
    for _ in range(10):
        step = completion.accept(int(logits.argmax()))
        text.append(step.text)
        logits = decode(model, pools, ["s"], [step.token])[0]
    assert served["choices"][0]["message"]["content"] == "".join(text)


def assert_concurrent_streams_equal_reference(url: str, reference, streams: int, base_tokens: int) -> None:
    """``streams`` concurrent streamed completions of growing prompts and lengths: each one's text
    equals ``reference`` (the in-process engine) and its usage counts its tokens."""
    import concurrent.futures as futures

    def one(i: int):
        body = {"model": MODEL, "prompt": prompt_ids(i), "max_tokens": base_tokens + i, "temperature": 0}
        return stream_text(f"{url}/v1/completions", {**body, "ignore_eos": True, **USAGE})

    with futures.ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(one, range(streams)))
    for i, (text, _, _, usage) in enumerate(results):
        assert usage["completion_tokens"] == base_tokens + i
        assert text == reference(prompt_ids(i), base_tokens + i)
