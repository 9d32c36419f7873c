"""Which host a handoff names: each process reads its host's name once (a system call each handoff
and each parked tensor was), and again only where a state's or tensor's host differs (renamed since)."""

from __future__ import annotations

import socket

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.layout import PoolLayout
from dayzero.kv.pools import KVPools, pools_for
from dayzero.kv.shared import SharedPools
from dayzero.model.forward import prefill
from dayzero.serving import parked
from dayzero.serving.handoff import Receiver, publish
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.parked import discard_tensor, publish_tensor, take_tensor

from ..conftest import random_ids


@pytest.fixture(scope="module")
def store(redis_url):
    return Lifecycle.connect(redis_url)


@pytest.fixture
def read_before_a_rename(monkeypatch):
    """This process read its host's name before the host was renamed to what it is now."""
    parked.this_host.cache_clear()
    with monkeypatch.context() as patched:
        patched.setattr(socket, "gethostname", lambda: "its-name-before")
        parked.this_host()
    yield
    parked.this_host.cache_clear()


def test_publish_reads_the_hosts_name_once(tiny_checkpoint, store, monkeypatch):
    """Each handoff read it (a system call) on prefill's loop."""
    model = load_model(tiny_checkpoint, progress=False)
    src = pools_for(model.cfg, torch.float32, 32)
    src.reserve("s", 9)
    first = publish(src, "s", "req-1", "shm", store, ttl_s=30)
    reads = []
    monkeypatch.setattr(socket, "gethostname", lambda: reads.append(1) or "read again")
    refs = [publish(src, "s", f"req-{i}", "shm", store, ttl_s=30) for i in range(2, 5)]
    assert not reads and {ref.host for ref in refs} == {first.host}


def test_parked_tensors_read_the_hosts_name_once(store, monkeypatch):
    """publish_tensor (vision), take_tensor (prefill) and discard_tensor (either) each read it."""
    first = publish_tensor(torch.randn(2), "img-first", "shm", store, ttl_s=30)
    reads = []
    monkeypatch.setattr(socket, "gethostname", lambda: reads.append(1) or "read again")
    taken = publish_tensor(torch.randn(3), "img-taken", "shm", store, ttl_s=30)
    assert take_tensor(taken, store).shape == (3,)
    discard_tensor(first, store)
    assert not reads and taken.host == first.host


def test_a_state_named_before_a_rename_is_refused_with_what_mends_it(tiny_checkpoint):
    """publish reads the host's name once: a decode worker started after the host was renamed
    refuses the states of a prefill worker started before it as another host's. Its error said
    "use handoff=redis across hosts" of one host: it names this host too, and the restart that mends it."""
    model = load_model(tiny_checkpoint, progress=False)
    src = pools_for(model.cfg, torch.float32, 32)
    src.reserve("s", 9)
    ref = publish(src, "s", "req-1", "shm", None, ttl_s=30).model_copy(update={"host": "its-name-before"})
    receiver = Receiver(None)
    try:
        with pytest.raises(LookupError, match=rf"not this one \({socket.gethostname()}\).*restart that prefill worker"):
            receiver.receive(ref, pools_for(model.cfg, torch.float32, 32), "d")
    finally:
        receiver.close()


def test_a_tensor_named_before_a_rename_is_refused_with_what_mends_it(store):
    """As a state: a prefill worker started after the rename refuses the tensors of a vision
    worker started before it, naming this host and the restart that mends it."""
    ref = publish_tensor(torch.randn(2), "img-renamed", "shm", store, ttl_s=30)
    named_before = ref.model_copy(update={"host": "its-name-before"})
    try:
        with pytest.raises(LookupError, match=rf"not this one \({socket.gethostname()}\).*restart that vision worker"):
            take_tensor(named_before, store)
    finally:
        discard_tensor(ref, store)


def test_a_receiver_takes_a_state_from_its_host_renamed_since_it_started(tiny_checkpoint, store, read_before_a_rename):
    """A state published under the host's new name is this host's still, not refused as another host's."""
    model = load_model(tiny_checkpoint, progress=False)
    layout = PoolLayout.of(model.cfg, 16, "float32")
    src, segment = SharedPools.create(
        layout, KVPools.sized(layout, 32, 1, torch.float32, device="meta").blocks, torch.float32
    )
    try:
        prefill(model, src, ["s"], [random_ids(9, model.cfg.vocab_size, seed=3)])
        receiver = Receiver(store)
        dst = pools_for(model.cfg, torch.float32, 32)
        renamed = publish(src, "s", "req-renamed", "shm", store, ttl_s=30).model_copy(
            update={"host": socket.gethostname()}
        )
        receiver.receive(renamed, dst, "d")
        assert dst.length("d") == 9
        elsewhere = renamed.model_copy(update={"host": "other"})
        with pytest.raises(LookupError, match="lives on host other"):
            receiver.receive(elsewhere, dst, "e")
        receiver.close()
        del src
    finally:
        segment.close()
        segment.unlink()


def test_a_tensor_from_its_host_renamed_since_its_reader_started_is_taken(store, read_before_a_rename):
    ref = publish_tensor(torch.randn(4), "img-new-name", "shm", store, ttl_s=30)
    renamed = ref.model_copy(update={"host": socket.gethostname()})
    assert take_tensor(renamed, store).shape == (4,)
