"""Sharded loading: a rank reads only its own slices and experts, in packed form, and they equal
the same rows of the whole model loaded on one rank. No collectives are needed to load, so
rank 1 of 2 is loaded here in-process."""

from __future__ import annotations

import pytest
import torch

from dayzero import checkpoint
from dayzero.parallel import Group, ParallelConfig
from dayzero.parallel.shard import split_dim
from dayzero.quant.quantize import quantize_checkpoint

from .test_tensor_parallel import FP8_TP2


class Recording:
    """safe_open that records which tensors are read whole and which in part."""

    def __init__(self, real, whole: list[str], parts: list[str]) -> None:
        self.real, self.whole, self.parts = real, whole, parts

    def __call__(self, *args, **kwargs):
        handle = self.real(*args, **kwargs)
        outer = self

        class Handle:
            def __enter__(self):
                self.f = handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def get_tensor(self, key):
                outer.whole.append(key)
                return self.f.get_tensor(key)

            def get_slice(self, key):
                outer.parts.append(key)
                return self.f.get_slice(key)

        return Handle()


@pytest.fixture(scope="module")
def fp8_path(checkpoint_factory, tmp_path_factory):
    src = checkpoint_factory("fp8_tp2", **FP8_TP2)
    return quantize_checkpoint(src, tmp_path_factory.mktemp("fp8_load"), progress=False, shards=2)


def test_rank_reads_only_its_slices_and_experts(fp8_path, monkeypatch):
    whole, parts = [], []
    monkeypatch.setattr(checkpoint, "safe_open", Recording(checkpoint.safe_open, whole, parts))
    rank1 = checkpoint.load_model(fp8_path, progress=False, group=Group(ParallelConfig(2, 1), object()))
    monkeypatch.undo()
    full = checkpoint.load_model(fp8_path, progress=False)
    assert all(".experts.0." not in k and ".experts.1." not in k for k in whole + parts)  # rank 0's experts
    assert any(".experts.3.w2.weight" in k for k in whole)  # its own, whole (packed FP4)
    split = [k for k in whole if split_dim(k.replace(".scale", ".weight")) is not None and ".experts." not in k]
    assert split == [] and any(k.endswith("attn.wq_b.scale") for k in parts)  # FP8 scales sliced too
    for name, local in rank1.state_dict().items():
        whole_tensor, dim = full.state_dict()[name], split_dim(name)
        if dim is None:
            assert torch.equal(local, whole_tensor), name
        else:
            size = local.shape[dim]
            assert size * 2 == whole_tensor.shape[dim], name
            assert torch.equal(local, whole_tensor.narrow(dim, size, size)), name  # rank 1: the second half
