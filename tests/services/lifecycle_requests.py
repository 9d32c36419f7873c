"""A request as the lifecycle's tests admit it."""

from __future__ import annotations

from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest


def request(rid: str) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=0.0)
