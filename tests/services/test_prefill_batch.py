"""The units of a prefill step: prompt merging, the echo, image splicing, chunked steps."""

from __future__ import annotations

import time

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.demo import write_demo_checkpoint
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill
from dayzero.model.plan import AttentionOptions
from dayzero.params import SamplingParams
from dayzero.sampling import PromptLogprobs
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_batch import (
    BatchInput,
    echo_of,
    forward_of,
    input_embeddings,
    prefill_chunks,
    prefilled_ids,
)
from dayzero.serving.prefilling import Prefilling, plan_step, tokens_of
from dayzero.vision.encoder import multimodal_prompt


def _job(prompt: tuple[int, ...], generated: tuple[int, ...] = (), prompt_logprobs: int | None = None) -> PrefillJob:
    sampling, now = SamplingParams(), time.time()
    request = GenerationRequest(
        request_id="r", prompt_ids=prompt, sampling=sampling, created=now, prompt_logprobs=prompt_logprobs
    )
    return PrefillJob(request=request, generated=generated)


def test_identical_text_inputs_share_one_forward_and_images_never_do():
    from dayzero.serving.messages import TensorRef

    image = TensorRef(transport="shm", location="dz-parked-0-x", host="h", shape=(2, 4))
    with_image = _job((1, 2, 3)).model_copy(update={"embeddings": image})
    keys = [forward_of(job) for job in (_job((1, 2, 3)), _job((1, 2, 3)), _job((1, 2, 3), prompt_logprobs=2))]
    assert keys[0] == keys[1] and keys[2] not in keys[:2]  # asking for prompt logprobs: a forward of its own
    assert forward_of(with_image) is None  # runs alone


def test_the_echo_is_scored_once_not_on_a_rerun():
    assert echo_of(_job((1, 2))) is None
    assert echo_of(_job((1, 2), prompt_logprobs=3)).top == 3
    assert echo_of(_job((1, 2), generated=(7,), prompt_logprobs=3)) is None  # its first token went out already


def test_a_rerun_prefills_the_tokens_it_streamed_but_the_last_which_decode_feeds():
    """The last streamed token is decode's pending one: the lost run's next round starts from it."""
    rerun = _job((1, 2, 3), generated=(7, 8, 9))
    assert prefilled_ids(rerun) == (1, 2, 3, 7, 8) and tokens_of(rerun) == 5
    assert prefilled_ids(_job((1, 2, 3), generated=(7,))) == prefilled_ids(_job((1, 2, 3))) == (1, 2, 3)
    assert forward_of(rerun) == forward_of(_job((1, 2, 3), generated=(7, 8, 4)))  # one state, a handoff each


def test_input_embeddings_equal_the_encoders_multimodal_prompt(tmp_path):
    model = load_model(write_demo_checkpoint(tmp_path, vision=True), torch.float32)
    image_token = model.cfg.raw["image_token_id"]
    images = torch.randn(3, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    expanded, reference = multimodal_prompt(model.embed, [0, 5, image_token, 6], image_token, [images])
    got = input_embeddings(model, BatchInput("r", [*expanded, 9, 10], images, prompt_length=len(expanded)))
    assert torch.equal(got[: len(expanded)], reference)
    assert torch.equal(got[len(expanded) :], model.embed.weight[[9, 10]])  # a re-run's streamed tokens follow


@pytest.mark.parametrize("budget", [None, 6])
def test_prompts_prefilled_a_chunk_per_step_beside_others_end_as_their_own_prefill(tmp_path, budget):
    """The prefill loop packs each prompt's next chunk with other prompts' chunks at other offsets
    (and images' patches at their chunk's placeholders): each ends with the logits, prompt logprobs
    and attention state (its MTP layer's included) of the uninterrupted prefill of the forward,
    which test_alignment compares with transformers. Chunks of 4, or as the loop's plan cuts them
    in steps of ``budget`` tokens (some shorter, the image's placeholders across them)."""
    model = load_model(write_demo_checkpoint(tmp_path, vision=True), torch.float32)
    image_token, options = model.cfg.raw["image_token_id"], AttentionOptions()
    patches = torch.randn(3, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    with_image = [0, 7, 9, image_token, image_token, image_token, 10, 11, 12, 13]
    inputs = [
        BatchInput("long", [(7 * i) % 90 + 10 for i in range(23)], echo=PromptLogprobs(2)),
        BatchInput("image", [*with_image, 30, 31], patches, prompt_length=len(with_image)),  # placeholders in 2 chunks
        BatchInput("short", [0, 5, 6]),
    ]
    packed = pools_for(model.cfg, torch.float32, 64, max_sequences=3, mtp=True)
    if budget is None:
        logits, chunks = {}, [item.chunks(4, image_token) for item in inputs]
        for step in range(max(i + len(c) for i, c in enumerate(chunks))):  # input i's first chunk at step i
            rows = [c[step - i] for i, c in enumerate(chunks) if 0 <= step - i < len(c)]
            outs = prefill_chunks(model, packed, rows, options)
            logits |= {c.seq_id: out for c, out in zip(rows, outs, strict=True) if out is not None}
    else:
        logits, sizes = _planned(model, packed, inputs, image_token, budget)
        assert {2, 3} <= sizes <= {1, 2, 3, 4}  # long prompts' chunks cut for the short one's room
    echo = PromptLogprobs(2)  # the long prompt's, prefilled whole
    for item in inputs:
        alone = pools_for(model.cfg, torch.float32, 64, mtp=True)
        embeds = [input_embeddings(model, item)] if item.images is not None else None
        scored = {0: echo} if item.echo is not None else None
        want = prefill(model, alone, [item.seq_id], [item.tokens], options, 4, embeds, scored)[0]
        assert (logits[item.seq_id] - want).abs().max().item() < 1e-5, item.seq_id
        token = int(want.argmax())
        got_next, want_next = (decode(model, p, [item.seq_id], [token])[0] for p in (packed, alone))
        assert (got_next - want_next).abs().max().item() < 1e-5, item.seq_id  # the same attention state
        assert torch.allclose(packed.hidden([item.seq_id], torch.float32), alone.hidden([item.seq_id], torch.float32))
        got_window, want_window = (_mtp_window(model, p, item.seq_id, len(item.tokens)) for p in (packed, alone))
        assert torch.allclose(got_window, want_window, atol=1e-5), item.seq_id  # rows at chunk ends included
    assert len(inputs[0].echo.scores) == 22
    for (ours, our_top), (theirs, their_top) in zip(inputs[0].echo.scores, echo.scores, strict=True):
        assert abs(ours - theirs) < 1e-5 and [t for t, _ in our_top] == [t for t, _ in their_top]


def _planned(model, pools, inputs: list[BatchInput], image_token: int, budget: int) -> tuple[dict, set[int]]:
    """Prefill ``inputs`` as the loop plans its steps (chunks of 4 at most, ``budget`` tokens a step),
    input i arriving before step i -> the logits of each, the chunk sizes run."""
    running, logits, sizes = [], {}, set()
    for step in range(100):
        running += [Prefilling([], inputs[step], [], image_token)] if step < len(inputs) else []
        if not running:
            return logits, sizes
        rows, chunks = plan_step(running, 4, budget)
        for p, chunk, out in zip(rows, chunks, prefill_chunks(model, pools, chunks, AttentionOptions()), strict=True):
            p.prefilled, sizes = p.prefilled + len(chunk.tokens), sizes | {len(chunk.tokens)}
            logits |= {chunk.seq_id: out} if out is not None else {}
        running = [p for p in running if p.left]
    raise AssertionError("not prefilled in 100 steps")


def _mtp_window(model, pools, seq_id: str, length: int) -> torch.Tensor:
    """The MTP layer's rows of the sequence's last window (it lags the main model by one position)."""
    table, bs = pools.sequences[seq_id].tables["window"], pools.layout.block_size
    slots = [p % (len(table) * bs) for p in range(max(0, length - pools.layout.sliding_window), length - 1)]
    return pools.window[model.cfg.num_layers, [table[s // bs] for s in slots], [s % bs for s in slots]]
