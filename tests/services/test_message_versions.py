"""Messages and records across versions (a rolling upgrade: gateways and workers of two versions
read each other's JSON). The previous version's models forbid a field they do not know, so what this
version writes must hold none of theirs; what it reads may hold fields of a later version.

``PREVIOUS`` is a decode job as the version before ``Grammar.param`` wrote it (its own output)."""

from __future__ import annotations

import json

from dayzero.params import Grammar, SamplingParams
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob, StateRef, prefill_job_json

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


def _job(param: str | None) -> DecodeJob:
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
        blocks={"window": (1,)},
    )
    return DecodeJob(request=request, generated=(9,), state=state)


def _keys(value: object, at: str = "") -> set[str]:
    """Every object key in ``value``, by its path (a dict's keys under a request's ``pool_blocks`` too)."""
    if isinstance(value, dict):
        return {f"{at}.{k}" for k in value} | {p for k, v in value.items() for p in _keys(v, f"{at}.{k}")}
    return set()


def test_the_previous_versions_job_reads_as_it_was_written():
    """A previous gateway's or prefill worker's message: its grammar names no field (its 400's param null)."""
    job = DecodeJob.model_validate_json(PREVIOUS)
    assert job == _job(None)
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
