"""Generation end conditions on the tiny model: EOS, stop strings, max tokens, context limit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from dayzero.chat import dsml
from dayzero.checkpoint import load_model
from dayzero.completion import Completion
from dayzero.completion_text import StopMatcher
from dayzero.demo import write_demo_checkpoint
from dayzero.engine import Timings, generate
from dayzero.kv.pools import pools_for
from dayzero.model.forward import score
from dayzero.sampling import SamplingParams
from dayzero.speculative import Speculation
from dayzero.tokenizer import TextCodec


def _pools(model):
    return pools_for(model.cfg, torch.float32, 256)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = write_demo_checkpoint(tmp_path_factory.mktemp("demo"))
    return load_model(path, progress=False), TextCodec.from_checkpoint(path)


def test_greedy_generation_follows_the_full_forward(demo):
    model, codec = demo
    prompt = codec.encode("The quick brown fox")
    steps = list(generate(model, codec, _pools(model), prompt, SamplingParams(max_tokens=12, ignore_eos=True)))
    tokens = [s.token for s in steps]
    assert len(tokens) == 12 and steps[-1].finish_reason == "length"
    ids = prompt + tokens[:-1]
    logits = score(model, pools_for(model.cfg, torch.float32, len(ids)), "s", ids)
    assert logits[len(prompt) - 1 :].argmax(dim=-1).tolist() == tokens


def test_penalised_greedy_generation_follows_the_full_forward_with_penalties_by_hand(demo):
    model, codec = demo
    prompt = codec.encode("The quick brown fox")
    params = SamplingParams(max_tokens=16, ignore_eos=True, presence_penalty=1.5, frequency_penalty=0.7)
    tokens = [s.token for s in generate(model, codec, _pools(model), prompt, params)]
    logits = score(model, pools_for(model.cfg, torch.float32, len(prompt) + 16), "s", prompt + tokens[:-1])
    plain = logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
    for i, row in enumerate(logits[len(prompt) - 1 :]):
        row = row.clone()
        for t in set(tokens[:i]):
            row[t] -= 1.5 + 0.7 * tokens[:i].count(t)
        assert int(row.argmax()) == tokens[i]
    assert plain != tokens  # the penalties changed the choice somewhere


@pytest.mark.parametrize("penalties", [{"frequency_penalty": 2.0}, {"presence_penalty": 1.5, "frequency_penalty": 0.7}])
def test_penalised_speculation_counts_the_tokens_kept_earlier_in_its_round(demo, penalties):
    """Drafts that are the plain run's own continuation (each kept, k = 2): every verify row is
    penalised for the tokens kept before it in the same round, so the tokens are the plain run's
    (penalised by the counts of earlier rounds only, "abc"'s differ)."""
    model, codec = demo
    prompt = codec.encode("abc")
    params = SamplingParams(max_tokens=16, ignore_eos=True, **penalties)
    plain = [s.token for s in generate(model, codec, _pools(model), prompt, params)]
    pools, timings = pools_for(model.cfg, torch.float32, 256, mtp=True), Timings()

    def truth(seq_ids: list[str], drafts: list[list[int]]) -> list[list[int]]:
        done = pools.length(seq_ids[0]) - len(prompt) + 1  # tokens emitted so far
        return [plain[done : done + len(drafts[0])]]

    spec = generate(model, codec, pools, prompt, params, timings, speculation=Speculation(2, truth))
    assert [s.token for s in spec] == plain
    assert timings.acceptance.accepted == timings.acceptance.drafted  # every draft was kept


def test_logprobs_are_the_full_forwards_log_softmax(demo):
    model, codec = demo
    prompt = codec.encode("The quick brown fox")
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.8, seed=4, logprobs=3)
    steps = list(generate(model, codec, _pools(model), prompt, params))
    ids = prompt + [s.token for s in steps][:-1]
    logp = torch.log_softmax(score(model, pools_for(model.cfg, torch.float32, len(ids)), "s", ids), dim=-1)
    for step, row in zip(steps, logp[len(prompt) - 1 :], strict=True):
        assert abs(step.logprob - row[step.token].item()) < 1e-5
        best = row.topk(3)
        assert [t for t, _ in step.top] == best.indices.tolist()
        assert max(abs(lp - want) for (_, lp), want in zip(step.top, best.values.tolist(), strict=True)) < 1e-5
    plain = list(generate(model, codec, _pools(model), prompt, replace(params, logprobs=None)))
    assert [s.token for s in plain] == [s.token for s in steps] and plain[0].logprob is None


def test_eos_stops_with_reason_stop(demo):
    model, codec = demo
    prompt = codec.encode("Hello")
    tokens = [
        s.token for s in generate(model, codec, _pools(model), prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    ]
    original = model.cfg
    model.cfg = replace(original, eos_token_ids=(tokens[2],))
    try:
        steps = list(generate(model, codec, _pools(model), prompt, SamplingParams(max_tokens=8)))
    finally:
        model.cfg = original
    assert [s.token for s in steps] == tokens[:3] and steps[-1].finish_reason == "stop"


def test_stop_string_cuts_the_text(demo):
    model, codec = demo
    prompt = codec.encode("Hello")
    free = "".join(
        s.text for s in generate(model, codec, _pools(model), prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    )
    stop = free[5:7]
    steps = list(
        generate(model, codec, _pools(model), prompt, SamplingParams(max_tokens=20, stop=(stop,), ignore_eos=True))
    )
    text = "".join(s.text for s in steps)
    assert steps[-1].finish_reason == "stop" and text == free[: free.find(stop)]


def test_context_limit_and_stats(demo):
    model, codec = demo
    prompt = codec.encode("Hello world")
    timings = Timings()
    steps = list(
        generate(
            model,
            codec,
            _pools(model),
            prompt,
            SamplingParams(max_tokens=50, ignore_eos=True),
            timings,
            max_context=len(prompt) + 4,
        )
    )
    assert steps[-1].finish_reason == "length" and len(steps) == 4
    summary = timings.summary()
    assert summary["prompt_tokens"] == len(prompt) and summary["completion_tokens"] == 4
    with pytest.raises(ValueError, match="context limit"):
        list(generate(model, codec, _pools(model), prompt, SamplingParams(), max_context=len(prompt)))


def test_stop_matcher_holds_back_partial_matches():
    m = StopMatcher(("END",))
    assert m.feed("abc E") == ("abc ", False)
    assert m.feed("N") == ("", False)
    assert m.feed("x") == ("ENx", False)
    assert m.feed("yEND tail") == ("y", True)


def _held_by_definition(text: str, stops: tuple[str, ...]) -> int:
    """The longest end of ``text`` that some stop string begins with (and is not all of it)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def test_stop_matcher_releases_what_the_definition_releases():
    """Random text in random pieces over a small alphabet (many partial matches) against the
    definition: release all but the longest held end, stop at the earliest match."""
    rng = random.Random(0)
    for _ in range(300):
        stops = tuple("".join(rng.choices("aab", k=rng.randint(1, 6))) for _ in range(rng.randint(1, 4)))
        matcher, pending = StopMatcher(stops), ""
        for _ in range(20):
            delta = "".join(rng.choices("aabc", k=rng.randint(0, 3)))
            text = pending + delta
            hits = [i for i in (text.find(s) for s in stops) if i >= 0]
            held = 0 if hits else _held_by_definition(text, stops)
            want = (text[: min(hits)], True) if hits else (text[: len(text) - held], False)
            assert matcher.feed(delta) == want, (stops, text)
            if hits:
                break
            pending = text[len(text) - held :]


def test_stop_strings_match_only_before_a_bound():
    """A tool-call block's opening bounds the stop strings' search: "\n" before a call's markup is
    no stop (it cut every call under tool_choice "required"), one in the reply's text still is. In
    random pieces, released text + flush is the definition's: the text up to the earliest stop
    string wholly before the first bound, or all of it."""
    bounds = ("\n\n<B>", "<B>")
    m = StopMatcher(("\n",), bounds)
    assert [m.feed(d) for d in ("ok", "\n", "\n<", "B>\nx\n")] == [("ok", False), ("", False), ("", False)] + [
        ("\n\n<B>\nx\n", False)
    ]
    m = StopMatcher(("\n",), bounds)
    assert [m.feed(d) for d in ("ok\n", "\nno")] == [("ok", False), ("", True)]
    rng = random.Random(1)
    for _ in range(300):
        text = "".join(rng.choices(["a", "b", "\n", "<B>", "<", "B>"], k=rng.randint(0, 12)))
        stops = tuple("".join(rng.choices("ab\n<", k=rng.randint(1, 3))) for _ in range(rng.randint(1, 3)))
        at = min((i for i in (text.find(b) for b in bounds) if i >= 0), default=len(text))
        hits = [i for i in (text[:at].find(s) for s in stops) if i >= 0]
        matcher, out, stopped, i = StopMatcher(stops, bounds), "", False, 0
        while i < len(text) and not stopped:
            k = rng.randint(1, 4)
            released, stopped = matcher.feed(text[i : i + k])
            out, i = out + released, i + k
        if not stopped:
            tail, stopped = matcher.flush()
            out += tail
        assert (out, stopped) == ((text[: min(hits)], True) if hits else (text, False)), (text, stops)


def test_tokenizer_round_trip_and_stream_decoder(demo):
    from dayzero.stream_decoder import StreamDecoder

    _, codec = demo
    text = "dayzero: héllo — 4 bits"
    ids = codec.encode(text)
    assert ids[0] == 0 and codec.decode(ids) == text
    stream = StreamDecoder(codec)
    assert "".join(stream.push(t) for t in ids[1:]) == text


def test_speculative_generation_cuts_at_the_stop_string_and_reports_acceptance(demo):
    """With the MTP layer drafting 2 tokens per step, the text up to a stop string is the plain
    decode's, and ``--stats`` gains the acceptance rate per draft position."""
    model, codec = demo
    prompt = codec.encode("Hello")
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    free = "".join(s.text for s in generate(model, codec, _pools(model), prompt, params))
    stop, timings = free[5:7], Timings()
    pools = pools_for(model.cfg, torch.float32, 256, mtp=True)
    spec = generate(model, codec, pools, prompt, replace(params, stop=(stop,)), timings, speculation=Speculation(2))
    steps = list(spec)
    assert steps[-1].finish_reason == "stop" and "".join(s.text for s in steps) == free[: free.find(stop)]
    summary = timings.summary()
    assert len(summary["acceptance_rate"]) == 2 and summary["mean_accepted_length"] >= 1


def _until_finished(completion: Completion, tokens: list[int]) -> tuple[str, str | None]:
    """The text ``completion`` releases for ``tokens`` up to its finish, and the finish."""
    text = ""
    for token in tokens:
        step = completion.accept(token)
        text += step.text
        if step.finish_reason:
            return text, step.finish_reason
    return text, None


def test_stop_strings_end_the_answer_not_the_thought(codec):
    """In thinking mode a stop string matches after ``</think>`` only: a thought that restates it
    runs on (it ended the reply inside the thought, before a forced call or schema could begin)."""
    thought, answer = codec.encode("Let me see: the end is near."), codec.encode(" Four. The end.")
    tokens = thought + [codec.token_id("</think>")] + answer
    params = SamplingParams(max_tokens=len(tokens) + 5, stop=("end",))
    want = ("Let me see: the end is near.</think> Four. The ", "stop")
    assert _until_finished(Completion(codec, params, (1,), 7, 4096, thinking=True), tokens) == want
    replayed = Completion(codec, params, (1,), 7, 4096, tuple(thought[:4]), thinking=True)  # rebuilt mid-thought
    assert _until_finished(replayed, tokens[4:]) == (want[0][len(codec.decode(thought[:4])) :], "stop")
    # outside thinking mode the same text is all answer
    assert _until_finished(Completion(codec, params, (1,), 7, 4096), tokens) == ("Let me see: the ", "stop")


def test_a_call_block_that_ends_the_thought_bounds_the_stop_strings(codec):
    """A thought may end with a call block instead of ``</think>``: its opening, split over tokens,
    was found once whole and the stop strings were fed only the last token's text, never the
    opening that bounds them; so "\\n" or "invoke" matched inside the block's markup and cut the
    call (finish "stop", no call). A stop string is not matched across ``</think>`` either: one
    beginning with the thought's closing blank line stays in the thought."""
    block = dsml.render_calls([{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}])
    tokens = codec.encode("Let me check.") + codec.encode(block)
    for stop in ("\n", "invoke", "Paris"):
        params = SamplingParams(max_tokens=len(tokens) + 5, stop=(stop,), stop_bounds=dsml.OPENINGS)
        assert _until_finished(Completion(codec, params, (1,), 7, 4096, thinking=True), tokens) == (
            "Let me check." + block,
            None,
        ), stop
        replayed = Completion(codec, params, (1,), 7, 4096, tuple(tokens[:-12]), thinking=True)  # rebuilt mid-block
        assert _until_finished(replayed, tokens[-12:]) == (codec.decode(tokens[-12:]), None)
    end, params = [codec.token_id("</think>")], SamplingParams(max_tokens=99, stop=("\n\nHi",))
    blank_in_the_thought = codec.encode("Hm.\n\n") + end + codec.encode("Hi there")
    assert _until_finished(Completion(codec, params, (1,), 7, 4096, thinking=True), blank_in_the_thought)[1] is None
    blank_in_the_answer = codec.encode("Hm.") + end + codec.encode("\n\nHi there")
    assert _until_finished(Completion(codec, params, (1,), 7, 4096, thinking=True), blank_in_the_answer) == (
        "Hm.</think>",
        "stop",
    )
