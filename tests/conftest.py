"""Shared fixtures: tiny random DeepSeek-V4 checkpoints built with transformers, and its model."""

from __future__ import annotations

import os

import torch

# The settings' variables (DAYZERO_*, REDIS_URL) of the shell pytest runs in, out of every test and what it
# starts: a shell that serves dayzero (DAYZERO_API_KEYS, DAYZERO_REDIS_URL, DAYZERO_CHECKPOINT) failed the
# tests that expect the defaults, the services' too (their gateways answered 401), and a session's stack.
for _name in [name for name in os.environ if name.startswith("DAYZERO_") or name == "REDIS_URL"]:
    del os.environ[_name]

if not torch.cuda.is_available():  # kernels run in Triton's interpreter on CPU; set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ctypes  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

from dayzero.demo import add_mtp, build_tokenizer, write_checkpoint  # noqa: E402
from dayzero.tokenizer import TextCodec  # noqa: E402

pytest_plugins = ["tests.speculative_cases"]  # the speculative tests' fixtures: mtp_model, plain_greedy, plain_tokens

from .transformers_logs import transformers_logs  # noqa: E402, F401 - a fixture
from .triton_interpreter import install as install_interpreter_patches  # noqa: E402
from .xdist_groups import (  # noqa: E402, F401 - hooks: each file, and the files sharing a stack, in one worker
    pytest_collection_modifyitems,
    pytest_configure_node,
    pytest_xdist_make_scheduler,
)

if os.environ.get("TRITON_INTERPRET") == "1":
    install_interpreter_patches()

TINY: dict[str, Any] = {
    "model_type": "deepseek_v4",
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "head_dim": 16,
    "partial_rotary_factor": 0.5,
    "q_lora_rank": 16,
    "o_groups": 2,
    "o_lora_rank": 8,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    # 16 indexer heads: an all-zero ReLU score (a tie whose order topk leaves unspecified) is rare
    "index_n_heads": 16,
    "index_head_dim": 8,
    "index_topk": 3,
    "hc_mult": 2,
    "n_routed_experts": 6,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "mlp_layer_types": ["hash_moe", "moe", "moe"],
    "max_position_embeddings": 8192,
}


def tiny_config(**overrides: Any) -> dict[str, Any]:
    return {**TINY, **overrides}


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests run: CUDA (compiled Triton) when present, else CPU (Triton's interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session")
def tol(device) -> float:
    """Kernel vs twin, fp32: exact maths up to summation order on CPU; TF32 tensor-core dots on GPU,
    whose inputs keep 10 mantissa bits (relative error up to 2^-11 each): outputs of magnitude ~2
    differ by ~2e-3 (the H200 run: 2.0003e-3 in decode attention), so twice that."""
    return 1e-5 if device == "cpu" else 4e-3


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory):
    """Build (once per config) a tiny random checkpoint in DeepSeek's published naming."""
    made: dict[str, Path] = {}

    def make(name: str, seed: int = 0, **overrides: Any) -> Path:
        if name not in made:
            made[name] = write_checkpoint(tmp_path_factory.mktemp(name), tiny_config(**overrides), seed)
        return made[name]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(checkpoint_factory) -> Path:
    return checkpoint_factory("tiny")


@pytest.fixture(scope="session")
def mtp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny config plus one random MTP layer (``mtp.0.*``), as the releases ship it."""
    out = write_checkpoint(tmp_path_factory.mktemp("mtp"), tiny_config(), seed=0)
    add_mtp(out, seed=0)
    return out


@pytest.fixture
def roomy_host(monkeypatch):
    """``up``'s pool room check (serving/pool_room.py) sees a /dev/shm and host memory of 1 TiB, all free, and
    sweeps nothing: an ``up`` in this process testing something else is this machine's no more (a CI container's
    64 MiB /dev/shm refused the default 256 MiB pools with exit 2). A test may patch ``room`` over it."""
    from dayzero.host_memory import HostRoom
    from dayzero.serving import pool_room

    monkeypatch.setattr(pool_room, "room", lambda folder: (1 << 40, 1 << 40))
    monkeypatch.setattr(pool_room, "sweep_stale", lambda folder: [])
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(1 << 40, "this test's 1 TiB"))


@pytest.fixture(scope="session")
def codec() -> TextCodec:
    """The demo tokenizer (V4's special tokens, byte-level BPE) for a model of 512 rows."""
    return TextCodec(build_tokenizer(512), tokens={"eos_token": "<｜end▁of▁sentence｜>"})


def run_dayzero(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``dayzero ARGS`` in a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "dayzero.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def fresh_python(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter (what a process imports, from nothing)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


PR_SET_CHILD_SUBREAPER = 36


def pytest_configure(config):
    """Orphans of the processes tests start (a killed supervisor's children) become ours, so the
    checks below see them instead of init adopting them unseen."""
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")  # live as long as we do


def _running(allowed: set[int]) -> list[psutil.Process]:
    """Our descendants that run (zombies have ended) and are not under an ``allowed`` pid."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or any(h in " ".join(proc.cmdline()) for h in INTERPRETER_HELPERS):
                continue
            lineage = {proc.pid, *(p.pid for p in proc.parents())}
        except psutil.NoSuchProcess:
            continue
        if not lineage & allowed:
            out.append(proc)
    return out


def _left_behind(allowed: set[int], timeout_s: float = 15) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _running(allowed)) and time.monotonic() < deadline:
        time.sleep(0.2)
    names = []
    for proc in left:
        try:
            names.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            continue
    return names


def _stack_pids(values) -> set[int]:
    """The processes of the stacks a test shares with others (module or session fixtures, checked
    when they end)."""
    return {pid for v in values if callable(getattr(v, "pids", None)) for pid in v.pids()}


@pytest.fixture(autouse=True)
def no_process_left_by_the_test(request):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = _left_behind(before | _stack_pids(request.node.funcargs.values()))
    assert not left, f"processes started by this test still run: {left}"


@pytest.fixture(scope="session")
def session_stacks() -> list:
    """The stacks several modules share (session fixtures add theirs): they outlive each module."""
    return []


LAST_USERS = pytest.StashKey[dict]()  # test id -> the session stack that stops after it


def shared(request, stack, session_stacks: list):
    """``stack``, a session fixture's, for the modules that ask for it (a module that defines a
    fixture of the same name has its own): the module process check lets it outlive each module,
    and it stops after the last test that uses it (idle beside the rest of the suite it would
    still take ~3% of a core). Under pytest-xdist all its users run in one worker, in collection
    order (xdist_groups.py): the others never start it."""
    name = request.fixturename
    users = [
        item.nodeid
        for item in request.session.items
        if name in getattr(item, "fixturenames", ()) and not hasattr(getattr(item, "module", None), name)
    ]
    session_stacks.append(stack)
    if users:
        request.config.stash.setdefault(LAST_USERS, {})[users[-1]] = stack
    return stack


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    stack = item.config.stash.get(LAST_USERS, {}).pop(item.nodeid, None)
    if stack is not None:
        stack.stop()


@pytest.fixture(scope="module", autouse=True)
def no_process_left_by_the_module(session_stacks):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = _left_behind(before | _stack_pids(session_stacks))
    assert not left, f"processes started in this module still run: {left}"
