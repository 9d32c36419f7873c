"""A completion's usage: thinking mode's reasoning tokens, counted as OpenAI reports them (the tokens
up to the one that ends the thought), also when a request is rebuilt from its streamed tokens, or
counted from them (a request that waited past the time limit: usage.py, time_limit.py)."""

from __future__ import annotations

from dayzero.completion import Completion
from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.time_limit import past_limit

EOS = (1,)


def _run(codec, tokens: list[int], thinking: bool, replayed: int = 0) -> dict:
    """The usage after ``tokens``, the first ``replayed`` of them rebuilt as another worker would."""
    params = SamplingParams(max_tokens=len(tokens) + 5)
    completion = Completion(codec, params, EOS, 7, 4096, tuple(tokens[:replayed]), thinking)
    for token in tokens[replayed:]:
        assert completion.accept(token).finish_reason is None
    return completion.usage()


def test_reasoning_tokens_are_those_up_to_the_end_of_the_thought(codec):
    thought, answer = codec.encode("Hmm, let me think about it."), codec.encode("The answer is 4.")
    end = [codec.token_id("</think>")]
    closed = _run(codec, thought + end + answer, thinking=True)
    want = {"prompt_tokens": 7, "completion_tokens": len(thought) + 1 + len(answer)}
    assert closed == {**want, "completion_tokens_details": {"reasoning_tokens": len(thought) + 1}}
    assert _run(codec, thought + end + answer, thinking=True, replayed=len(thought) + 3) == closed
    assert _run(codec, thought + end + answer, thinking=False) == want  # no thinking, no details
    unclosed = _run(codec, thought, thinking=True)  # cut before it closed: all of it is reasoning
    assert unclosed["completion_tokens_details"] == {"reasoning_tokens": len(thought)}
    # a call block opened without </think> also ends it, once its opening tag is whole
    block = codec.encode("\n\n<｜DSML｜tool_calls>")
    calls = _run(codec, thought + block + codec.encode('\n<｜DSML｜invoke name="f">'), thinking=True)
    assert len(block) > 1 and calls["completion_tokens_details"] == {"reasoning_tokens": len(thought) + len(block)}


def test_the_gateway_counts_a_streamed_request_as_its_completion_would(codec):
    """A request that waited past the time limit (in a queue: the gateway ends it; for a worker's
    room: the worker) gets the usage its completion would have given it, thinking mode's reasoning
    tokens included (its chat answer would otherwise lack ``completion_tokens_details``)."""
    thought, answer = codec.encode("Hmm, let me think about it."), codec.encode("The answer is 4.")
    block = codec.encode("\n\n<｜DSML｜tool_calls>")
    for tokens in (thought, thought + [codec.token_id("</think>")] + answer, thought + block + answer):
        for thinking in (True, False):
            request = GenerationRequest(
                request_id="r",
                prompt_ids=(0,) * 7,
                sampling=SamplingParams(max_tokens=99),
                created=0.0,
                thinking=thinking,
            )
            assert past_limit(codec, request, tokens, 1.0).usage == _run(codec, tokens, thinking)
