"""The sampling contract: what it refuses, and its trip over the broker by field name."""

from __future__ import annotations

import json
import time

import pytest

from dayzero.params import MAX_SEED, Grammar, SamplingParams
from dayzero.serving.messages import GenerationRequest


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_tokens=0),
        dict(temperature=-1.0),
        dict(temperature=1e-310),  # subnormal: logits / temperature overflow to infinities
        dict(top_p=-0.1),
        dict(top_p=1.1),
        dict(top_k=-1),
        dict(seed=MAX_SEED + 1),  # seed * 1_000_003 + index must fit torch's 64-bit seed
        dict(stop=("",)),
        dict(stop=("ok", "a\udcff")),  # argv's undecodable byte, JSON's lone surrogate: it never matched
        dict(logprobs=21),
        dict(presence_penalty=2.5),
        dict(frequency_penalty=-2.1),
        dict(logit_bias=((3, 100.5),)),
    ],
)
def test_invalid_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_the_bounds_themselves_are_accepted():
    SamplingParams(temperature=1e-3, top_p=0.0, seed=MAX_SEED, presence_penalty=-2.0, logprobs=20)


def test_sampling_params_cross_the_broker_by_field_name_and_come_back_equal():
    params = SamplingParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=4,
        seed=11,
        stop=("\n\n", "END"),
        logit_bias=((3, -1.5), (9, 2.0)),
        presence_penalty=0.25,
        logprobs=2,
        grammar=Grammar('start: "yes" | "no"', after=5),
    )
    request = GenerationRequest(request_id="r", prompt_ids=(1, 2), sampling=params, created=time.time())
    wire = json.loads(request.model_dump_json())
    assert wire["sampling"]["top_k"] == 4 and wire["sampling"]["grammar"] == {"lark": 'start: "yes" | "no"', "after": 5}
    back = GenerationRequest.model_validate_json(json.dumps(wire))
    assert back.sampling == params and isinstance(back.sampling, SamplingParams)


def test_a_message_that_breaks_the_contract_is_refused_when_read():
    request = GenerationRequest(request_id="r", prompt_ids=(1,), sampling=SamplingParams(), created=time.time())
    wire = json.loads(request.model_dump_json())
    wire["sampling"]["temperature"] = 1e-310
    with pytest.raises(ValueError, match="temperature"):
        GenerationRequest.model_validate_json(json.dumps(wire))
