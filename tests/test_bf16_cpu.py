"""A bf16 model on the CPU (``DAYZERO_DTYPE=bfloat16`` with no GPU): the engine's prefill and decode
against transformers' model in bf16 on the same tiny checkpoint, and ``dayzero generate`` through
the same steps.

Tolerances on logits (max |logit| ~0.4 here): each side rounds its activations to bf16 (8 bits of
mantissa, ~0.4% a rounding) at different places (dayzero keeps norms, HC and sinks in fp32).
Measured: 0.011 over a prompt and 0.003 a decode step, where transformers' own bf16 run is 0.008
off its fp32 run; hence 0.02 a prompt, 0.01 a step. A decode window one short or long, positions
one off, or the compressors' buffered rows zeroed: 0.034 - 0.044; the buffered rows scaled by 0.4:
0.014 a step (under the 0.03 this test had).
"""

from __future__ import annotations

import torch

from dayzero import cli, engine
from dayzero.align import reference_model
from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill, score

from .conftest import random_ids

PROMPT_TOL, STEP_TOL = 0.02, 0.01


def test_bf16_prompt_and_decode_steps_follow_transformers_in_bf16(tiny_checkpoint):
    ref = reference_model(tiny_checkpoint).to(torch.bfloat16)
    ours = load_model(tiny_checkpoint, torch.bfloat16, progress=False)
    ids = random_ids(70, ours.cfg.vocab_size, seed=1)  # > window (8), > several compression blocks
    with torch.no_grad():  # row i: the logits after ids[: i + 1] (causal: as a run on that prefix, bitwise)
        expected = ref(torch.tensor([ids])).logits[0].float()
    got = score(ours, pools_for(ours.cfg, torch.bfloat16, len(ids)), "s", ids).float()
    assert (got - expected).abs().max().item() < PROMPT_TOL
    assert expected.abs().max().item() > 10 * PROMPT_TOL  # not two near-zero tensors
    pools = pools_for(ours.cfg, torch.bfloat16, len(ids))
    logits = prefill(ours, pools, ["s"], [ids[:50]])
    for end in range(50, len(ids)):  # each step's logits vs the reference's after the same prefix
        assert (logits[0].float() - expected[end - 1]).abs().max().item() < STEP_TOL, f"decode step at {end}"
        logits = decode(ours, pools, ["s"], [ids[end]])


def test_generate_in_bf16_on_the_cpu_prints_the_engines_greedy_tokens(tiny_checkpoint, monkeypatch, capsys):
    """The tokens alone do not show the dtype (an fp32 run prints the same ones here): the engine's
    model and pools are checked to be bf16 too."""
    monkeypatch.setenv("DAYZERO_DTYPE", "bfloat16")
    monkeypatch.setenv("DAYZERO_DEVICE", "cpu")
    ran_in, run = [], engine.generate

    def generate(model, codec, pools, *rest):
        ran_in.append((model.head.weight.dtype, pools.window.dtype))
        return run(model, codec, pools, *rest)

    monkeypatch.setattr(engine, "generate", generate)
    prompt = [3, 14, 15, 9, 26]
    args = ["--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", "6", "--temperature", "0"]
    assert cli.main(["generate", "--checkpoint", str(tiny_checkpoint), *args]) == 0
    printed = [int(t) for t in capsys.readouterr().out.strip().split(",")]
    model = load_model(tiny_checkpoint, torch.bfloat16, progress=False)
    pools = pools_for(model.cfg, torch.bfloat16, len(prompt) + 6)
    tokens = [prefill(model, pools, ["s"], [prompt])[0].argmax().item()]
    while len(tokens) < 6:
        tokens.append(decode(model, pools, ["s"], tokens[-1:])[0].argmax().item())
    assert printed == tokens
    assert ran_in == [(torch.bfloat16, torch.bfloat16)]
