"""What ``Settings`` refuses beyond each field's own bounds: list values as the environment writes
them, API keys no client could send, settings that contradict each other or this host's devices.
Each raises ValueError with what to set instead (pydantic reports it under the setting's name)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings


def comma_list(value: object, keep_empty: bool) -> object:
    """A list setting's environment text, comma-separated (or a JSON list), as a list. ``keep_empty``
    keeps empty items for a later check to refuse: in a key list "," alone would have turned
    authentication off, "a,,b" is a typo."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)
    items = [k.strip() for k in text.split(",")] if text else []
    return items if keep_empty else [k for k in items if k]


def keys_a_client_can_send(keys: list[str]) -> list[str]:
    """An empty key would accept every request without one (its Bearer key reads as ""), one with
    surrounding spaces matches no header (HTTP strips them), and one beyond printable ASCII is no
    Bearer token (RFC 6750): clients send it as bytes they do not agree on (curl UTF-8) or not at
    all (httpx: ``dayzero up --example`` died on it, taking the stack down): refused, not silent."""
    for i, key in enumerate(keys):  # (a key is a secret: named by its place, not shown)
        if not key.strip():
            raise ValueError("an empty key would let every request in without one; leave it out")
        if key != key.strip():
            raise ValueError(f"key {i} has surrounding whitespace, which no Authorization header can carry")
        if not all(" " <= c <= "~" for c in key):
            raise ValueError(
                f"key {i} has a character outside printable ASCII (a tab, 'é'), which clients send as differing bytes"
                " (curl: UTF-8) or not at all (httpx); use printable ASCII"
            )
    return keys


def handoff_follows_the_device(data: object) -> object:
    """Unset, the handoff is the device's own: CUDA IPC for pools on a GPU (shm moves CPU pools)."""
    if isinstance(data, dict) and data.get("handoff") is None and str(data.get("device", "")).startswith("cuda"):
        return {**data, "handoff": "cuda_ipc"}
    return data


def fits_device(settings: Settings) -> None:
    """The kernels, the handoff and CUDA graphs each need the device they run on."""
    on_gpu = settings.device.startswith("cuda")
    if settings.attention_backend == "triton" and not on_gpu:
        raise ValueError(
            "DAYZERO_ATTENTION_BACKEND=triton compiles for a GPU: set DAYZERO_DEVICE=cuda, or use torch on CPU"
        )
    if settings.handoff == "shm" and on_gpu:
        raise ValueError(
            f"DAYZERO_HANDOFF=shm moves CPU pools; with DAYZERO_DEVICE={settings.device} use cuda_ipc (same GPU) "
            "or redis"
        )
    if settings.handoff == "cuda_ipc" and not on_gpu:
        raise ValueError(f"DAYZERO_HANDOFF=cuda_ipc needs DAYZERO_DEVICE=cuda, not {settings.device}")
    if settings.decode_graphs and (
        settings.attention_backend != "triton" or settings.speculative_tokens or settings.tensor_parallel > 1
    ):
        raise ValueError(
            "DAYZERO_DECODE_GRAPHS needs DAYZERO_ATTENTION_BACKEND=triton (on a GPU), one rank per worker "
            "and no speculative decoding"
        )


def refused_in_a_group(service: str, settings: Settings, ranks: int) -> None:
    """A ValueError for the settings a worker of ``ranks`` ranks cannot run with, before anything starts
    (``serve`` of a group, torchrun's of one too; ``up``'s --prefill-tp / --decode-tp before its stack)."""
    if settings.speculative_tokens:  # the followers would need each round's accepted drafts
        raise ValueError("DAYZERO_SPECULATIVE_TOKENS runs on one rank for now: set it to 0 for a group")
    if settings.decode_graphs and service == "decode" and ranks > 1:  # (one rank: no collective, no follower)
        # a group's step all-reduces across the ranks: rank 0's warm-up captured its graphs alone (the
        # others wait for a message, not a collective), and a replay waiting on a dead rank never times out
        raise ValueError(
            "DAYZERO_DECODE_GRAPHS runs on one rank: unset it to serve decode with --tensor-parallel "
            "(or DAYZERO_TENSOR_PARALLEL, or torchrun) over several ranks"
        )


def a_chunk_fits_a_step(settings: Settings) -> None:
    """A prompt's chunk runs within one prefill step: one larger than the step cannot (the step
    would pass its bound, or the chunk never fit)."""
    if settings.prefill_chunk_size > settings.max_prefill_tokens:
        default = "" if "prefill_chunk_size" in settings.model_fields_set else " (its default)"
        raise ValueError(
            f"DAYZERO_PREFILL_CHUNK_SIZE={settings.prefill_chunk_size}{default} is larger than "
            f"DAYZERO_MAX_PREFILL_TOKENS={settings.max_prefill_tokens}, the tokens of a whole prefill step: set "
            f"DAYZERO_PREFILL_CHUNK_SIZE to {settings.max_prefill_tokens} or less"
        )


def device_on_this_host(device: str) -> None:
    """Refuse a CUDA ``device`` this host does not have (imports torch: for the commands that compute)."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"DAYZERO_DEVICE={device} but CUDA is not available on this host")
    index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"DAYZERO_DEVICE={device} but this host has {count} CUDA device(s)")
