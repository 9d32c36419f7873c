"""The pipeline on a GPU: weights and pools on CUDA, the KV handoff over CUDA IPC between the
prefill and decode processes (skipped without CUDA; run by bench/gpu.sh on a GPU host)."""

from __future__ import annotations

import concurrent.futures as futures

import httpx
import pytest
import torch

from .conftest import MODEL, chat, data_url, prompt_ids, start_stack, stream_text
from .in_process import engine_completer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA IPC handoff)"),
]


@pytest.fixture(scope="module")
def gpu_stack(demo_dir, tmp_path_factory):
    gpu = {"DAYZERO_DEVICE": "cuda", "DAYZERO_HANDOFF": "cuda_ipc"}
    s = start_stack(demo_dir, tmp_path_factory.mktemp("logs"), {"vision": 1, "prefill": 1, "decode": 2}, gpu)
    yield s
    s.stop()


def test_concurrent_completions_equal_the_in_process_engine_on_the_gpu(gpu_stack, demo_dir):
    reference = engine_completer(demo_dir, "cuda")

    def run(i: int) -> str:
        body = {"model": MODEL, "prompt": prompt_ids(i), "max_tokens": 12 + i, "temperature": 0, "ignore_eos": True}
        return stream_text(f"{gpu_stack.url}/v1/completions", body)[0]

    with futures.ThreadPoolExecutor(8) as pool:
        served = list(pool.map(run, range(8)))
    for i, text in enumerate(served):
        assert text == reference(prompt_ids(i), 12 + i), i


def test_image_request_reaches_the_gpu_prefill(gpu_stack):
    content = [{"type": "text", "text": "what is"}, {"type": "image_url", "image_url": {"url": data_url(60, 45, 1)}}]
    body = {**chat("unused", max_tokens=6, ignore_eos=True), "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{gpu_stack.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6


def test_decode_graphs_serve_what_eager_decoding_serves(text_dir, tmp_path_factory):
    """``DAYZERO_DECODE_GRAPHS=1``: steps replayed from CUDA graphs (batches of 1 to 4 sequences, so
    buckets of 1, 2 and 4 rows) stream the in-process engine's greedy tokens."""
    env = {"DAYZERO_DEVICE": "cuda", "DAYZERO_HANDOFF": "cuda_ipc", "DAYZERO_ATTENTION_BACKEND": "triton"}
    s = start_stack(
        text_dir, tmp_path_factory.mktemp("logs"), {"prefill": 1, "decode": 1}, {**env, "DAYZERO_DECODE_GRAPHS": "1"}
    )
    try:
        reference = engine_completer(text_dir, "cuda", "triton")  # eager steps, the same kernels

        def run(i: int) -> str:
            body = {
                "model": MODEL,
                "prompt": prompt_ids(i),
                "max_tokens": 10 + 3 * i,
                "temperature": 0,
                "ignore_eos": True,
            }
            return stream_text(f"{s.url}/v1/completions", body)[0]

        with futures.ThreadPoolExecutor(4) as pool:
            served = list(pool.map(run, range(4)))
    finally:
        s.stop()
    for i, text in enumerate(served):
        assert text == reference(prompt_ids(i), 10 + 3 * i), i
