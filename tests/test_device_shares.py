"""How ``dayzero up`` splits DAYZERO_KV_MEMORY_FRACTION between the workers it places on one GPU
(device_shares.py), and the environment each worker gets from it."""

from __future__ import annotations

import re

import pytest
import torch

from dayzero import cli
from dayzero.device_shares import devices_of, kv_fractions
from dayzero.settings import Settings

ONE_EACH = {"vision": 0, "prefill": 1, "decode": 1}


def _fraction(env: dict[str, dict[str, str]], service: str) -> float | None:
    value = env.get(service, {}).get("DAYZERO_KV_MEMORY_FRACTION")
    return None if value is None else float(value)


def test_a_worker_computes_on_its_device_a_group_on_the_first_ranks():
    assert devices_of("cuda", 1) == [0] and devices_of("cuda:3", 1) == [3] and devices_of("cuda", 4) == [0, 1, 2, 3]


def test_one_gpus_prefill_and_decode_each_take_half_the_default():
    env = kv_fractions(Settings(device="cuda"), ONE_EACH, {})
    assert _fraction(env, "prefill") == pytest.approx(0.4) and _fraction(env, "decode") == pytest.approx(0.4)


def test_each_worker_takes_its_share_of_its_most_crowded_device():
    """Prefill over cuda:0-1 (2 workers), decode on cuda:0 (1 worker): cuda:0 holds 3, cuda:1 holds 2."""
    env = kv_fractions(Settings(device="cuda"), {"prefill": 2, "decode": 1}, {"prefill": 2})
    assert _fraction(env, "prefill") == pytest.approx(0.8 / 3) and _fraction(env, "decode") == pytest.approx(0.8 / 3)
    alone = kv_fractions(Settings(device="cuda:1"), ONE_EACH, {"prefill": 1, "decode": 2})
    assert _fraction(alone, "prefill") == pytest.approx(0.4)  # cuda:1: the prefill and decode's rank 1
    assert _fraction(alone, "decode") == pytest.approx(0.4)


@pytest.mark.parametrize(
    "settings",
    [
        Settings(device="cpu"),
        Settings(device="cuda", kv_budget_mb=4096),
        Settings(device="cuda", kv_memory_fraction=0.3),
    ],
)
def test_no_split_where_no_fraction_is_read_or_the_user_set_one(settings):
    assert kv_fractions(settings, ONE_EACH, {}) == {}


def test_no_split_for_a_worker_alone_on_its_devices():
    env = kv_fractions(Settings(device="cuda"), {"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 2})
    assert env == {"prefill": {"DAYZERO_KV_MEMORY_FRACTION": "0.4"}, "decode": {"DAYZERO_KV_MEMORY_FRACTION": "0.4"}}
    assert kv_fractions(Settings(device="cuda"), {"prefill": 1, "decode": 0}, {}) == {}
    # up's own placement: prefill on cuda:2, decode's 2 ranks on cuda:0-1; no GPU holds two workers (a split
    # by the number of workers, not their devices, gave each 0.4)
    apart = kv_fractions(Settings(device="cuda:2"), ONE_EACH, {"decode": 2})
    assert apart == {}


def test_a_set_fraction_the_workers_on_one_device_cannot_all_take_is_refused():
    with pytest.raises(ValueError, match=r"=0.8 is each worker's share of its GPU, and up places 2 .* cuda:0"):
        kv_fractions(Settings(device="cuda", kv_memory_fraction=0.8), ONE_EACH, {})


@pytest.mark.parametrize("workers", [2, 3, 6, 7, 9, 11, 12, 15, 19])
def test_the_fraction_a_refusal_names_is_taken(workers):
    """The refusal's "set it to X or less" is a fraction up takes: 1/6 printed as 0.17 was refused itself
    (6 x 0.17 = 1.02 of the GPU), and 19 x 0.05 (0.95 of it, 0.9500000000000001 in floats) was too."""
    counts = {"prefill": workers // 2, "decode": workers - workers // 2}
    with pytest.raises(ValueError, match=rf"places {workers} prefill and decode") as refused:
        kv_fractions(Settings(device="cuda", kv_memory_fraction=0.9), counts, {})
    named = float(re.search(r"set it to ([0-9.]+) or less", str(refused.value)).group(1))
    assert 0 < named <= 0.95 / workers + 1e-12  # (up's bound: 0.95 of a GPU, settings.MOST_KV_MEMORY_FRACTION)
    assert kv_fractions(Settings(device="cuda", kv_memory_fraction=named), counts, {}) == {}


def test_up_gives_each_worker_on_one_gpu_its_share(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """A one-GPU stack (cuda, the cuda_ipc handoff): each prefill and decode child's environment, as up
    spawns it, carries half the default; the gateway's carries none, nor any child's where it is set."""
    from dayzero import procs, stack

    spawned: dict[str, dict[str, str]] = {}

    class Spawner:  # records what each child would be started with
        def __call__(self, fn, *args):
            if fn is procs.spawn:
                cmd, _log, env = args
                spawned[cmd[cmd.index("--name") + 1]] = env

        def close(self) -> None:
            pass

    def wait_ready(self, timeout_s, on_wait, on_restart=None):
        raise TimeoutError("enough")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU, faked
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(stack, "answering", lambda url, within_s: None)
    monkeypatch.setattr(stack.Stack, "wait_ready", wait_ready)
    start = stack.Stack.start

    def start_recorded(self):
        self._spawner = Spawner()
        start(self)

    monkeypatch.setattr(stack.Stack, "start", start_recorded)
    monkeypatch.setenv("DAYZERO_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("DAYZERO_DEVICE", "cuda")
    monkeypatch.delenv("DAYZERO_KV_MEMORY_FRACTION", raising=False)
    argv = ["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(tmp_path / "logs"), "--port", "18999"]
    assert cli.main(argv) == 1
    assert "starting: redis" in capsys.readouterr().err
    assert float(spawned["prefill0"]["DAYZERO_KV_MEMORY_FRACTION"]) == pytest.approx(0.4)
    assert float(spawned["decode0"]["DAYZERO_KV_MEMORY_FRACTION"]) == pytest.approx(0.4)
    assert "DAYZERO_KV_MEMORY_FRACTION" not in spawned["gateway"]
    assert Settings(device="cuda").handoff == "cuda_ipc"  # the handoff such a stack runs with
    spawned.clear()
    monkeypatch.setenv("DAYZERO_KV_MEMORY_FRACTION", "0.3")  # set: each worker's own
    assert cli.main(argv) == 1
    assert [spawned[w]["DAYZERO_KV_MEMORY_FRACTION"] for w in ("prefill0", "decode0")] == ["0.3", "0.3"]
