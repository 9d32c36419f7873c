"""Messages and records across versions (a rolling upgrade: gateways and workers of two versions
read each other's JSON). The models of the version before ``Grammar.param`` and ``StateRef.block_ids``
forbid a field they do not know, so what this version writes for them (DAYZERO_HANDOFF_IDS=lists) must
hold none of theirs; the version after them (the previous release) reads ``block_ids``, which this
version writes by default (``bytes``); what it reads may hold fields of a later version.

``PREVIOUS`` is a decode job as the version before ``Grammar.param`` wrote it (its own output);
``PREVIOUS_BYTES`` the same job as the previous release wrote it with DAYZERO_HANDOFF_IDS=bytes (its
one block id, 1, as int64 little-endian, base64)."""

from __future__ import annotations

import json

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kv.pools import pools_for
from dayzero.params import Grammar, SamplingParams
from dayzero.serving.handoff import publish
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob, StateRef, prefill_job_json
from dayzero.settings import Settings

from ..conftest import tiny_config

PREVIOUS = (
    '{"request":{"request_id":"r1","kind":"chat","prompt_ids":[0,5],"sampling":{"max_tokens":8,'
    '"temperature":0.0,"top_p":1.0,"top_k":0,"seed":null,"stop":[],"stop_bounds":[],"ignore_eos":false,'
    '"logit_bias":[],"presence_penalty":0.0,"frequency_penalty":0.0,"logprobs":null,'
    '"grammar":{"lark":"start: \\"{}\\"","after":7}},"created":1.0,"images":0,"echo":false,'
    '"prompt_logprobs":null,"thinking":false,"tool_calls":true,"usage_in_stream":false,"response_id":"",'
    '"choice":0,"prompt_index":0,"trace":{}},"generated":[9],"state":{"transport":"shm","location":"seg",'
    '"host":"h","layout_hash":"abc","dtype":"float32","pool_blocks":{"window":4},"length":2,'
    '"blocks":{"window":[1]},"holder":""},"attempt":0}'
)
PREVIOUS_BYTES = PREVIOUS.replace('"blocks":{"window":[1]}', '"block_ids":"AQAAAAAAAAA="')
IDS = {"lists": {"blocks": {"window": (1,)}}, "bytes": {"block_ids": b"\x01" + bytes(7)}}


def _job(param: str | None, ids: str = "lists") -> DecodeJob:
    sampling = SamplingParams(max_tokens=8, grammar=Grammar('start: "{}"', 7, param))
    request = GenerationRequest(
        request_id="r1", kind="chat", prompt_ids=(0, 5), sampling=sampling, created=1.0, tool_calls=True
    )
    state = StateRef(
        transport="shm",
        location="seg",
        host="h",
        layout_hash="abc",
        dtype="float32",
        pool_blocks={"window": 4},
        length=2,
        **IDS[ids],
    )
    return DecodeJob(request=request, generated=(9,), state=state)


def _keys(value: object, at: str = "") -> set[str]:
    """Every object key in ``value``, by its path (a dict's keys under a request's ``pool_blocks`` too)."""
    if isinstance(value, dict):
        return {f"{at}.{k}" for k in value} | {p for k, v in value.items() for p in _keys(v, f"{at}.{k}")}
    return set()


@pytest.mark.parametrize(("written", "ids"), [(PREVIOUS, "lists"), (PREVIOUS_BYTES, "bytes")])
def test_the_previous_versions_job_reads_as_it_was_written(written, ids):
    """A previous gateway's or prefill worker's message: its grammar names no field (its 400's param
    null); its block ids as lists (every version before ``bytes`` became the default) or as bytes."""
    job = DecodeJob.model_validate_json(written)
    assert job == _job(None, ids)
    assert job.request.sampling.grammar == Grammar('start: "{}"', 7)


def test_what_this_version_writes_the_previous_one_reads():
    """A grammar's ``param`` stays on the gateway that admitted it: on the wire (the message, and the
    record a previous gateway's reaper or resumed stream reads) the previous version refused it
    ('sampling.grammar.param: Unexpected keyword argument': every constrained request failed on a
    worker not yet upgraded)."""
    written = json.loads(_job("tools").model_dump_json())
    assert _keys(written) == _keys(json.loads(PREVIOUS))
    record = _job("response_format").request.model_dump_json()
    assert _keys(json.loads(prefill_job_json(record))) <= _keys(json.loads(PREVIOUS))


@pytest.mark.parametrize(("ids", "reader"), [("default", PREVIOUS_BYTES), ("lists", PREVIOUS)])
def test_a_published_state_holds_only_the_fields_its_decode_reads(ids, reader):
    """Prefill's state as DAYZERO_HANDOFF_IDS says: by default (bytes) the fields of the previous
    release's, whose decode reads ``block_ids``; ``lists`` those of the version before it, whose
    decode refuses ``block_ids`` (an unknown field, and no ``blocks``)."""
    setting = Settings.model_fields["handoff_ids"].default if ids == "default" else ids
    pools = pools_for(ModelConfig.from_dict(tiny_config()), torch.float32, 64)
    pools.reserve("s", 9)
    pools.sequences["s"].length = 9
    written = json.loads(publish(pools, "s", "r", "shm", None, ttl_s=30, ids=setting).model_dump_json())
    assert set(written) == set(json.loads(reader)["state"])


def test_a_later_versions_fields_are_ignored():
    """A field a later version adds (a gateway upgraded before this worker) is read past, in every
    model a message holds: the request, its sampling, its grammar, the job, the state."""
    later = json.loads(PREVIOUS)
    later["next"] = 1
    later["state"]["next"] = 1
    later["request"]["next"] = 1
    later["request"]["sampling"]["next"] = 1
    later["request"]["sampling"]["grammar"]["next"] = 1
    assert DecodeJob.model_validate_json(json.dumps(later)) == _job(None)
    prefill = {"request": later["request"], "attempt": 1, "next": {"any": "shape"}}
    assert PrefillJob.model_validate_json(json.dumps(prefill)).request == _job(None).request


def test_a_top_p_of_0_is_sent_as_what_the_previous_release_reads():
    """The previous release's workers refuse a top_p below 1e-3 (its SamplingParams check: the whole
    job fails to parse); top_p 0 keeps greedy's token alone, so the gateway sends it as greedy."""
    from types import SimpleNamespace

    from services.gateway.routes import _spec
    from services.gateway.schemas import CompletionRequest

    settings = SimpleNamespace(model_name="m", max_tokens_limit=64)
    gw = SimpleNamespace(settings=settings, context_limit=100, codec=SimpleNamespace(has_tokenizer=False), vocab_size=9)
    body = CompletionRequest(model="m", prompt=[1, 2], top_p=0, temperature=1.5, seed=3)
    sent = json.loads(
        GenerationRequest(
            request_id="r", kind="completion", prompt_ids=(1, 2), sampling=_spec(gw, body, [1, 2], 8), created=1.0
        ).model_dump_json()
    )["sampling"]
    assert 1e-3 <= sent["top_p"] <= 1.0 and sent["temperature"] == 0.0, sent
