"""`dayzero up` refusing, in one line and before starting anything, a stack whose workers could not
load their weights or hold their attention pools (the checkpoint's headers, the pool plan, /dev/shm)."""

from __future__ import annotations

import json
import shutil

import pytest

from dayzero import cli

pytestmark = pytest.mark.usefixtures("roomy_host")  # (up's pool room check: not this machine's)


def _truncate(ckpt):
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])


def _a_directory_in_its_place(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").mkdir()


def _widen_vocabulary(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda ckpt: (ckpt / "model.safetensors").unlink(), "no *.safetensors files in {ckpt}"),
        (_truncate, "model.safetensors is not a readable safetensors file: "),
        (lambda ckpt: (ckpt / "model.safetensors").write_bytes(b"\x00" * 1000), "model.safetensors is not a readable"),
        (_widen_vocabulary, "tensor 'embed.weight' has shape [96, 32], expected [97, 32] (and "),
        (_a_directory_in_its_place, "{ckpt}/model.safetensors is a directory, not a safetensors file"),
    ],
)
def test_up_refuses_weights_its_workers_could_not_load(damage, message, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """Read from the safetensors headers, as the workers' loader reads them first: one line, no stack."""
    from dayzero import stack

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    damage(ckpt)
    assert cli.main(["up", "--checkpoint", str(ckpt), "--log-dir", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(ckpt=ckpt)) and len(err.splitlines()) == 1
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DAYZERO_KV_BUDGET_MB": "1", "DAYZERO_MAX_BATCH": "4096"},
            "DAYZERO_KV_BUDGET_MB=1 cannot hold the sliding windows of DAYZERO_MAX_BATCH=4096 sequences",
        ),
        (
            {"DAYZERO_BLOCK_SIZE": "100000", "DAYZERO_KV_BUDGET_MB": "256"},
            "DAYZERO_KV_BUDGET_MB=256 cannot hold the sliding windows of ",
        ),
        ({"DAYZERO_KV_BUDGET_MB": "1"}, "DAYZERO_KV_BUDGET_MB=1 holds 3907 tokens of one sequence, under the context"),
    ],
)
def test_up_refuses_pools_its_workers_could_not_serve_from(env, message, tmp_path, capsys, monkeypatch):
    """Pools that cannot hold the batch's windows: each worker loaded its weights, exited with a
    traceback naming no variable, and up restarted it until it gave up (exit 1). Pools shorter than
    the context: a request without max_tokens, or of a long prompt, failed with a 500 once admitted."""
    from dayzero import stack

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["up", "--log-dir", str(tmp_path / "logs")]) == 2  # the built-in model: context 4096
    err = capsys.readouterr().err
    assert err.startswith("error: " + message) and len(err.splitlines()) == 1
    assert not (tmp_path / "logs").exists()


def test_up_refuses_prefill_pools_dev_shm_cannot_hold_before_starting_anything(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    """docker's 64 MiB /dev/shm and the default 256 MiB budget: up started the stack, the prefill worker
    loaded its weights and was refused, three times, before up gave up (exit 1 after 24 s, the demo model)."""
    from dayzero import stack
    from dayzero.serving import pool_room

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    monkeypatch.setattr(pool_room, "room", lambda folder: (64 << 20, 64 << 20))
    monkeypatch.delenv("DAYZERO_KV_BUDGET_MB", raising=False)
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the attention pools of 1 prefill worker, 1 x 25") and len(err.splitlines()) == 1
    assert "do not fit in /dev/shm, where 64 MiB of its 64 MiB are free" in err and "--shm-size=" in err
    assert not (tmp_path / "logs").exists()
