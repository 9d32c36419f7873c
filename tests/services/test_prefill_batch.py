"""The units of a prefill step: prompt merging, the echo, image splicing, the step itself."""

from __future__ import annotations

import time

import torch

from dayzero.checkpoint import load_model
from dayzero.demo import write_demo_checkpoint
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill
from dayzero.model.plan import AttentionOptions
from dayzero.params import SamplingParams
from dayzero.sampling import PromptLogprobs
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_batch import BatchInput, echo_of, input_embeddings, merged, prefill_batch
from dayzero.vision.encoder import multimodal_prompt


def _job(prompt: tuple[int, ...], generated: tuple[int, ...] = (), prompt_logprobs: int | None = None) -> PrefillJob:
    sampling, now = SamplingParams(), time.time()
    request = GenerationRequest(
        request_id="r", prompt_ids=prompt, sampling=sampling, created=now, prompt_logprobs=prompt_logprobs
    )
    return PrefillJob(request=request, generated=generated)


def test_identical_text_prompts_share_one_forward_and_images_never_do():
    image = torch.zeros(2, 4)
    inputs = [
        BatchInput("a", [1, 2, 3]),
        BatchInput("b", [1, 2, 3]),  # the same prompt: shares a's forward
        BatchInput("c", [1, 2, 3], echo=PromptLogprobs(2)),  # asks for prompt logprobs: a forward of its own
        BatchInput("d", [1, 2, 3], images=image),
        BatchInput("e", [1, 2, 3], images=image),
        BatchInput("f", [1, 2, 3], echo=PromptLogprobs(2)),  # shares c's
    ]
    assert merged(inputs) == {0: 0, 1: 0, 2: 2, 3: 3, 4: 4, 5: 2}


def test_the_echo_is_scored_once_not_on_a_rerun():
    assert echo_of(_job((1, 2))) is None
    assert echo_of(_job((1, 2), prompt_logprobs=3)).top == 3
    assert echo_of(_job((1, 2), generated=(7,), prompt_logprobs=3)) is None  # its first token went out already


def test_input_embeddings_equal_the_encoders_multimodal_prompt(tmp_path):
    model = load_model(write_demo_checkpoint(tmp_path, vision=True), torch.float32)
    image_token = model.cfg.raw["image_token_id"]
    images = torch.randn(3, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    expanded, reference = multimodal_prompt(model.embed, [0, 5, image_token, 6], image_token, [images])
    got = input_embeddings(model, BatchInput("r", [*expanded, 9, 10], images, prompt_length=len(expanded)))
    assert torch.equal(got[: len(expanded)], reference)
    assert torch.equal(got[len(expanded) :], model.embed.weight[[9, 10]])  # a re-run's streamed tokens follow


def test_a_merged_prompt_gets_the_state_and_logits_of_its_own_prefill(tmp_path):
    model = load_model(write_demo_checkpoint(tmp_path), torch.float32)
    prompt = [0, 9, 8, 7, 6, 5, 4, 3, 2]
    pools = pools_for(model.cfg, torch.float32, 32, max_sequences=2)
    inputs = [BatchInput("a", prompt), BatchInput("b", prompt)]
    logits = prefill_batch(model, pools, inputs, merged(inputs), AttentionOptions(), 4)
    alone = pools_for(model.cfg, torch.float32, 32)
    want = prefill(model, alone, ["ref"], [prompt], AttentionOptions(), 4)[0]
    assert torch.equal(logits[0], logits[1]) and (logits[0] - want).abs().max().item() < 1e-5
    assert pools.sequences["a"].length == pools.sequences["b"].length == len(prompt)
