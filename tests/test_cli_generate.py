"""``dayzero generate`` takes and refuses the sampling options as the API takes and refuses them."""

from __future__ import annotations

import json

import pytest

from dayzero import checkpoint, cli


def _generate(checkpoint_dir, *options: str) -> list[str]:
    return ["generate", "--checkpoint", str(checkpoint_dir), "--prompt-ids", "1,2", *options]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-tokens", "5000"], "--max-tokens 5000 exceeds the limit 4096 (DAYZERO_MAX_TOKENS_LIMIT)"),
        (
            ["--max-tokens", "8191"],  # the tiny model's context: 8192
            "prompt (2) + --max-tokens (8191) exceeds the context limit 8192",
        ),
    ],
)
def test_max_tokens_the_api_refuses_are_refused_before_the_model_loads(
    options, message, tiny_checkpoint, monkeypatch, capsys
):
    """``--max-tokens 100000`` was taken and ran on, silently, to the end of the context, where the API
    answers 400 (over DAYZERO_MAX_TOKENS_LIMIT, 4096, or past the context after the prompt)."""
    monkeypatch.setenv("DAYZERO_MAX_TOKENS_LIMIT", "4096" if "5000" in options else "100000")
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(_generate(tiny_checkpoint, *options)) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_top_k_minus_one_is_every_token_as_the_api_reads_it(tiny_checkpoint, capsys):
    """``--top-k -1`` was refused ("--top-k must be >= 0"), while the API takes -1 (vLLM's every token)."""
    sampled = _generate(tiny_checkpoint, "--max-tokens", "8", "--temperature", "1", "--seed", "7")
    assert cli.main([*sampled, "--top-k", "0"]) == 0
    every = capsys.readouterr().out
    assert cli.main([*sampled, "--top-k", "-1"]) == 0
    assert capsys.readouterr().out == every
    with pytest.raises(SystemExit):
        cli.main([*sampled, "--top-k", "-2"])
    assert "argument --top-k: must be -1 or 0 (every token) or a count, got -2" in capsys.readouterr().err


def test_any_64_bit_seed_is_taken_and_reduced_as_the_api_reduces_it(tiny_checkpoint, capsys):
    """``--seed`` took [0, 2**44] where the API takes any int64 (and demo-checkpoint, train-demo 0..2**63-1):
    -1 was refused. The API reduces a seed modulo 2**44 + 1: -1 draws as 2**44 does."""
    sampled = _generate(tiny_checkpoint, "--max-tokens", "8", "--temperature", "1")
    assert cli.main([*sampled, "--seed", str(1 << 44)]) == 0
    drawn = capsys.readouterr().out
    assert cli.main([*sampled, "--seed", "-1"]) == 0
    assert capsys.readouterr().out == drawn
    for command in (sampled, ["demo-checkpoint", "out"], ["train-demo", "out"]):
        with pytest.raises(SystemExit):
            cli.main([*command, "--seed", str(1 << 63)])
        assert f"argument --seed: must be a 64-bit integer, from -2**63 to 2**63 - 1, got {1 << 63}" in (
            capsys.readouterr().err
        )


@pytest.mark.parametrize(
    ("env", "prompt", "made"),
    [({"DAYZERO_MAX_TOKENS_LIMIT": "5"}, "1,2", 5), ({"DAYZERO_MAX_CONTEXT": "40"}, ",".join(["3"] * 33), 7)],
)
def test_max_tokens_left_out_is_what_the_limit_and_the_context_leave(
    env, prompt, made, tiny_checkpoint, capsys, monkeypatch
):
    """Left out, --max-tokens was 64 and checked as if given: DAYZERO_MAX_TOKENS_LIMIT=5 or a prompt within 64
    tokens of the context was refused ("--max-tokens 64 exceeds the limit 5"), where the API, given no
    max_tokens, takes both and fills what the limit and the context leave."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["generate", "--checkpoint", str(tiny_checkpoint), "--prompt-ids", prompt, "--stats"]
    assert cli.main([*argv, "--temperature", "0"]) == 0, capsys.readouterr().err
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert stats["completion_tokens"] == made, stats  # what the limit or the context leaves (greedy: no EOS)
