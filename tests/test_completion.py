"""dayzero.completion: a completion's text at its end. A last token that leaves a UTF-8 character
cut short (max_tokens or EOS reached inside it) ends in U+FFFD, as transformers' decode of the ids
gives it; stop strings still match that end, and the thought's split and a call's markup take it
as the text it is."""

from __future__ import annotations

import random

import pytest

from dayzero.chat.output import parse_message
from dayzero.completion import Completion
from dayzero.demo import write_demo_checkpoint
from dayzero.params import SamplingParams
from dayzero.tokenizer import TextCodec

from .test_tokenizer import _byte_token

EOS = 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("completion") / "demo")


@pytest.fixture(scope="module")
def codec(checkpoint):
    return TextCodec.from_checkpoint(checkpoint)


@pytest.fixture(scope="module")
def hf_decode(checkpoint):
    """transformers' decode of a completion's ids (special tokens skipped unless ``skip`` is
    False): the reference."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    return lambda ids, skip=True: tokenizer.decode(ids, skip_special_tokens=skip)


def _run(codec, ids: list[int], thinking: bool = False, **sampling) -> tuple[list[str], str | None]:
    """Each step's text for ``ids`` fed as sampled tokens (max_tokens: their count unless given),
    and the finish reason of the step that ended it."""
    params = SamplingParams(**{"max_tokens": len(ids), **sampling})
    completion, texts = Completion(codec, params, (EOS,), 3, 4096, thinking=thinking), []
    for token in ids:
        step = completion.accept(token)
        texts.append(step.text)
        if step.finish_reason is not None:
            return texts, step.finish_reason
    return texts, None


def test_a_character_cut_short_at_max_tokens_ends_in_u_fffd(codec, hf_decode):
    lead = _byte_token(codec, 0xE4)  # the first of 中's three bytes
    assert _run(codec, [lead]) == (["\ufffd"], "length")  # max_tokens 1: was "" (the lead byte dropped)
    assert hf_decode([lead]) == b"\xe4".decode(errors="replace") == "\ufffd"
    hi = codec.encode("Hi", special=False)
    cut = hi + [lead, _byte_token(codec, 0xB8)]  # 中 two bytes of three in
    assert "".join(_run(codec, cut)[0]) == hf_decode(cut) == "Hi\ufffd"


def test_a_character_cut_short_by_eos_ends_in_u_fffd(codec, hf_decode):
    ids = codec.encode("Hi", special=False) + [_byte_token(codec, 0xF0), EOS]  # 🚀's first byte, then EOS
    texts, finish = _run(codec, ids, max_tokens=10)
    assert finish == "stop" and texts[-1] == "\ufffd"
    assert "".join(texts) == hf_decode(ids) == "Hi\ufffd"


def test_every_end_of_random_ids_is_their_decoded_text(codec, hf_decode):
    """Random ids (cut characters, stray bytes), ended by max_tokens or by EOS at every length:
    the streamed steps join to transformers' decode of the ids."""
    rng = random.Random(1)
    for _ in range(4):
        ids = [rng.randrange(10, codec.vocab_size) for _ in range(40)]
        for n in range(1, len(ids) + 1):
            assert "".join(_run(codec, ids[:n])[0]) == hf_decode(ids[:n]), (ids, n)
            assert "".join(_run(codec, ids[:n] + [EOS], max_tokens=99)[0]) == hf_decode(ids[:n]), (ids, n)


def test_stop_strings_match_the_end_a_cut_character_gives(codec):
    ids = codec.encode("Hi", special=False) + [_byte_token(codec, 0xE4)]
    assert _run(codec, ids, stop=("i\ufffd",)) == (["H", "", ""], "stop")  # was "Hi", "length"
    assert _run(codec, ids + [EOS], max_tokens=9, stop=("i\ufffd",)) == (["H", "", "", ""], "stop")
    assert "".join(_run(codec, ids, stop=("i!",))[0]) == "Hi\ufffd"  # a held "i" released with the end
    assert _run(codec, ids, stop=("H",)) == ([""], "stop")  # one before it ends it as before


def test_the_thought_and_a_call_take_the_end_as_their_text(codec):
    lead = _byte_token(codec, 0xE4)
    thought = codec.encode("plan", special=False)
    texts, _ = _run(codec, thought + [lead], thinking=True)  # cut in the thought: the thought's
    parsed = parse_message("".join(texts), thinking=True)
    assert (parsed.reasoning, parsed.content) == ("plan\ufffd", "")
    answer = thought + [lead, codec.token_id("</think>")] + codec.encode("ok", special=False) + [lead, EOS]
    parsed = parse_message("".join(_run(codec, answer, thinking=True, max_tokens=99)[0]), thinking=True, stopped=True)
    assert (parsed.reasoning, parsed.content) == ("plan\ufffd", "ok\ufffd")
    head = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x'
    tail = "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    call = codec.encode(head, special=False) + [lead] + codec.encode(tail, special=False) + [EOS]
    parsed = parse_message("".join(_run(codec, call, max_tokens=99)[0]), thinking=False, stopped=True)
    assert parsed.content == "" and [(c.name, c.arguments) for c in parsed.calls] == [("f", '{"a": "x\ufffd"}')]


def test_a_call_cut_inside_its_markup_leaves_no_markup_in_the_content(codec, hf_decode):
    """max_tokens inside ``｜`` (3 bytes) of a parameter's closing tag: the text is the ids' decode,
    and the call, cut by a limit, is begun but not made; no part of the tag reaches the content."""
    head = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x</'
    ids = codec.encode(head, special=False) + [_byte_token(codec, 0xEF), _byte_token(codec, 0xBD)]
    texts, finish = _run(codec, ids)
    assert finish == "length" and "".join(texts) == hf_decode(ids, skip=False) == head + "\ufffd"
    parsed = parse_message("".join(texts), thinking=False)
    assert (parsed.content, parsed.started, parsed.calls) == ("", ["f"], [])
