"""Both KV handoff transports move a prefilled state so that decoding continues identically."""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.handoff import LayoutMismatch
from dayzero.kv.layout import PoolLayout
from dayzero.kv.pools import KVPools, pools_for
from dayzero.kv.shared import CudaSharedPools, SharedPools
from dayzero.model.forward import decode, prefill
from dayzero.serving.handoff import Receiver, publish
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.parked import discard_tensor, publish_tensor, sweep_parked, take_tensor
from dayzero.shm import SHM_DIR

from ..conftest import random_ids


@pytest.fixture(scope="module")
def store(redis_url):
    return Lifecycle.connect(redis_url)


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_transport_round_trip_continues_decoding(tiny_checkpoint, store, transport):
    model = load_model(tiny_checkpoint, progress=False)
    layout = PoolLayout.of(model.cfg, 16, "float32")
    blocks = KVPools.sized(layout, 80, 2, torch.float32, device="meta").blocks
    src, segment = SharedPools.create(layout, blocks, torch.float32)
    try:
        prompt = random_ids(37, model.cfg.vocab_size, seed=13)
        first = prefill(model, src, ["s"], [prompt])[0]
        ref = publish(src, "s", f"req-{transport}", transport, store, ttl_s=30)
        assert ref.transport == transport
        dst = pools_for(model.cfg, torch.float32, 80)
        Receiver(store).receive(ref, dst, "moved")
        follow = [int(first.argmax()), *random_ids(12, model.cfg.vocab_size, seed=14)]
        moved = torch.stack([decode(model, dst, ["moved"], [t])[0] for t in follow])
        stayed = torch.stack([decode(model, src, ["s"], [t])[0] for t in follow])
        assert torch.equal(moved, stayed)
        other = pools_for(model.cfg, torch.float32, 80, block_size=8)
        with pytest.raises(LayoutMismatch):
            Receiver(store).receive(ref, other, "x")
    finally:
        segment.close()
        segment.unlink()


class _Exploit:
    def __reduce__(self):  # what a pickle in Redis could run in decode under torch.load(weights_only=False)
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_redis_state_is_raw_buffers_and_a_pickle_there_is_refused_unrun(tiny_checkpoint, store, tmp_path):
    import pickle

    model = load_model(tiny_checkpoint, progress=False)
    src = pools_for(model.cfg, torch.float32, 40)
    prefill(model, src, ["s"], [random_ids(20, model.cfg.vocab_size, seed=3)])
    ref = publish(src, "s", "req-raw", "redis", store, ttl_s=30)
    data = store.r.get(ref.location)
    assert b"__metadata__" in data[:4096] and b"dayzero_state" in data[:4096]  # a safetensors header
    exploit = _Exploit()
    exploit.path = str(tmp_path / "ran")
    store.r.set(ref.location, pickle.dumps(exploit))
    with pytest.raises(LayoutMismatch, match="not a dayzero state"):
        Receiver(store).receive(ref, pools_for(model.cfg, torch.float32, 40), "x")
    assert not (tmp_path / "ran").exists()


def test_a_state_whose_prefill_worker_died_is_a_lookup_error(tiny_checkpoint, store):
    """Decode skips it (the reaper re-runs the request) instead of failing on it every step."""
    model = load_model(tiny_checkpoint, progress=False)
    layout = PoolLayout.of(model.cfg, 16, "float32")
    src, segment = SharedPools.create(
        layout, KVPools.sized(layout, 32, 1, torch.float32, device="meta").blocks, torch.float32
    )
    prefill(model, src, ["s"], [random_ids(9, model.cfg.vocab_size, seed=3)])
    ref = publish(src, "s", "req-dead", "shm", store, ttl_s=30)
    segment.close()
    segment.unlink()  # the worker died and its segment was swept
    with pytest.raises(LookupError, match="is gone"):
        Receiver(store).receive(ref, pools_for(model.cfg, torch.float32, 32), "moved")


def _mapped(name: str) -> bool:
    return name in open("/proc/self/maps").read()  # noqa: SIM115 - a one-shot read


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")
def test_decode_unmaps_the_segment_of_a_prefill_worker_that_was_replaced(tiny_checkpoint, store):
    """A prefill restart sweeps its predecessor's segment and publishes a new one: decode attaches to
    the new one and lets the old mapping go (unlinked but mapped, its memory stayed allocated in
    /dev/shm for decode's whole life: one pool segment more per prefill restart)."""
    model = load_model(tiny_checkpoint, progress=False)
    layout = PoolLayout.of(model.cfg, 16, "float32")
    blocks = KVPools.sized(layout, 32, 1, torch.float32, device="meta").blocks
    receiver, segments = Receiver(store), []
    try:
        for i in range(2):  # the first prefill worker, then its replacement
            src, segment = SharedPools.create(layout, blocks, torch.float32)
            segments.append(segment)
            prefill(model, src, ["s"], [random_ids(9, model.cfg.vocab_size, seed=3)])
            ref = publish(src, "s", f"req-restart-{i}", "shm", store, ttl_s=30)
            receiver.receive(ref, pools_for(model.cfg, torch.float32, 32), "moved")
            del src
            if i == 0:  # the worker dies; its successor sweeps the segment
                segment.close()
                segment.unlink()
        assert not _mapped(segments[0].name)
        assert _mapped(segments[1].name)  # the live one stays attached
    finally:
        segments[1].close()
        segments[1].unlink()


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")
def test_a_closed_receiver_has_unmapped_every_segment(tiny_checkpoint, store):
    model = load_model(tiny_checkpoint, progress=False)
    layout = PoolLayout.of(model.cfg, 16, "float32")
    blocks = KVPools.sized(layout, 32, 1, torch.float32, device="meta").blocks
    src, segment = SharedPools.create(layout, blocks, torch.float32)
    try:
        prefill(model, src, ["s"], [random_ids(9, model.cfg.vocab_size, seed=3)])
        receiver = Receiver(store)
        receiver.receive(
            publish(src, "s", "req-close", "shm", store, ttl_s=30), pools_for(model.cfg, torch.float32, 32), "d"
        )
        del src
        segment.close()  # the creator's own mapping
        assert _mapped(segment.name)  # the receiver's
        receiver.close()
        assert not _mapped(segment.name)
    finally:
        segment.unlink()


def _decode_elsewhere(checkpoint, ref, redis_url, follow, out) -> None:
    """In a fresh process (CUDA IPC handles cannot be opened by their exporter): receive, decode."""
    model = load_model(checkpoint, device="cuda", progress=False)
    dst = pools_for(model.cfg, torch.float32, 80, device="cuda")
    Receiver(Lifecycle.connect(redis_url)).receive(ref, dst, "moved")
    # as a list: a tensor crosses the queue as a file descriptor this process must outlive
    out.put(torch.stack([decode(model, dst, ["moved"], [t])[0] for t in follow]).cpu().tolist())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA IPC)")
def test_cuda_ipc_round_trip_continues_decoding_in_another_process(tiny_checkpoint, store, redis_url):
    import multiprocessing

    model = load_model(tiny_checkpoint, device="cuda", progress=False)
    layout = PoolLayout.of(model.cfg, 16, "float32")
    blocks = KVPools.sized(layout, 80, 2, torch.float32, device="meta").blocks
    src = CudaSharedPools.create(layout, blocks, torch.float32, "cuda")
    prompt = random_ids(37, model.cfg.vocab_size, seed=13)
    first = prefill(model, src, ["s"], [prompt])[0]
    ref = publish(src, "s", "req-cuda", "cuda_ipc", store, ttl_s=30)
    follow = [int(first.argmax()), *random_ids(12, model.cfg.vocab_size, seed=14)]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_decode_elsewhere, args=(tiny_checkpoint, ref, redis_url, follow, out))
    child.start()
    moved = torch.tensor(out.get(timeout=300))
    child.join(60)
    stayed = torch.stack([decode(model, src, ["s"], [t])[0] for t in follow]).cpu()
    assert child.exitcode == 0
    assert torch.equal(moved, stayed)  # same GPU, same kernels: bitwise


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_parked_image_embeddings_are_read_once(store, transport):
    tensor = torch.randn(7, 5)
    ref = publish_tensor(tensor, f"img-{transport}", transport, store, ttl_s=30)
    assert torch.equal(take_tensor(ref, store), tensor)
    with pytest.raises((LookupError, FileNotFoundError)):
        take_tensor(ref, store)


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_discarded_parked_tensor_is_gone(store, transport):
    ref = publish_tensor(torch.randn(3, 2), f"drop-{transport}", transport, store, ttl_s=30)
    discard_tensor(ref, store)
    discard_tensor(ref, store)  # idempotent: a redelivered job may discard again
    with pytest.raises((LookupError, FileNotFoundError)):
        take_tensor(ref, store)


def test_sweep_unlinks_only_parked_segments_past_their_deadline(store):
    expired = publish_tensor(torch.randn(2), "old", "shm", store, ttl_s=-1)
    alive = publish_tensor(torch.randn(2), "new", "shm", store, ttl_s=30)
    swept = sweep_parked()  # (a stack's vision worker, this run's or a parallel one's, may sweep it first)
    assert alive.location not in swept and not (SHM_DIR / expired.location).exists()
    assert take_tensor(alive, store).shape == (2,)  # still readable


@pytest.mark.parametrize(("device", "transport"), [("cuda", "shm"), ("cpu", "cuda_ipc"), ("cuda:0", "shm")])
def test_settings_refuse_a_transport_the_device_cannot_use(device, transport):
    from pydantic import ValidationError

    from dayzero.settings import Settings

    with pytest.raises(ValidationError, match="handoff"):
        Settings(device=device, handoff=transport)
    assert Settings(device=device, handoff="redis").device == device  # Redis carries state from anywhere
