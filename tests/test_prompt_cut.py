"""A completion after a prompt that ends in a character cut short, or in a run of byte tokens its
first bytes turn into bytes that are not UTF-8 (``lead_space.prompt_lead``'s cut, ``StreamDecoder._held``).

Where transformers' decode of prompt and completion begins with the prompt's decode, the
completion's text is the rest of it. Where the completion completes the prompt's cut character,
the whole's text does not begin with the prompt's (its U+FFFD is the character now): the text is the
rest after the prompt's text before that character, which is what vLLM's detokenizer gives (a
tokenizers ``DecodeStream`` primed with the prompt's ids holds the cut character for the completion).
"""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerFast

from dayzero.completion import Completion
from dayzero.completion_text import CompletionText
from dayzero.demo import build_tokenizer
from dayzero.params import SamplingParams
from dayzero.tokenizer import TextCodec

from .test_lead_space import llama_style

EOS = (2,)
TEXT = "Hi 中文 and 🙂 ok"  # (3- and 4-byte characters: byte tokens in the byte-fallback tokenizer)


def _completed(codec, prompt: list[int], completion: list[int]) -> str:
    """What a completion of ``completion``'s tokens after ``prompt`` releases, live, and at its end."""
    built = Completion(codec, SamplingParams(max_tokens=100), EOS, len(prompt), 4096, prompt_ids=prompt)
    return "".join(built.accept(token).text for token in completion) + built.end()[0]


def _vllm(tokenizer: Tokenizer, prompt: list[int], completion: list[int]) -> str:
    """vLLM's v1 detokenizer: a ``DecodeStream`` primed with the prompt's ids, then the completion's."""
    stream = DecodeStream(skip_special_tokens=True)
    for token in prompt:
        stream.step(tokenizer, token)
    return "".join(stream.step(tokenizer, token) or "" for token in completion)


@pytest.fixture(params=["byte_fallback", "byte_level"])
def tokenizers(request) -> tuple[Tokenizer, TextCodec]:
    """Llama's byte-fallback decoder, and DeepSeek's byte-level one (the demo tokenizer's)."""
    tokenizer = llama_style() if request.param == "byte_fallback" else build_tokenizer(512)
    return tokenizer, TextCodec(tokenizer)


def test_a_character_the_prompt_cuts_short_is_the_completions_once_it_completes_it(tokenizers):
    """``TEXT`` cut into prompt and completion at each token (a BOS first): where the prompt ends in
    a character cut short (its decode ends in U+FFFD), the completion's text begins with that
    character, as vLLM's; it lost it (an empty text for 中's last byte token) and, decoded alone on a
    byte-level tokenizer, began with U+FFFD. Elsewhere it is transformers' decode of the whole past
    the prompt's, as before."""
    tokenizer, codec = tokenizers
    reference = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    ids = reference.encode(TEXT, add_special_tokens=False)
    cut = 0
    for at in range(1, len(ids)):
        prompt, completion = ids[:at], ids[at:]
        whole, before = reference.decode(prompt + completion), reference.decode(prompt)
        text = _completed(codec, prompt, completion)
        if before.endswith("\ufffd"):
            cut += 1
            assert text == _vllm(tokenizer, prompt, completion) and whole.endswith(text), at
        else:
            assert text == whole[len(before) :], at
    assert cut >= 3


def test_a_cut_character_the_completion_breaks_stays_the_prompts():
    """A prompt ending in 中's first two bytes, the completion "d": transformers' decode of the whole
    is the prompt's ("Hello" and two U+FFFD) then "d", and so is the completion's text "d" (the two
    U+FFFD are the prompt's text)."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    prompt = [1, *reference.encode("Hello", add_special_tokens=False), *_bytes(tokenizer, "中".encode()[:2])]
    d = [tokenizer.token_to_id("d")]
    assert reference.decode(prompt + d, skip_special_tokens=True) == "Hello\ufffd\ufffdd"
    assert reference.decode(prompt, skip_special_tokens=True) == "Hello\ufffd\ufffd"
    assert _completed(codec, prompt, d) == "d"


@pytest.mark.parametrize(
    ("written", "text"), [(b"\x80", "\ufffd"), ("文".encode() + b"\x80", "\ufffd" * 4), ("文".encode(), "文")]
)
def test_a_run_of_byte_tokens_from_the_prompt_the_completion_breaks_is_one_u_fffd_a_byte_of_its(written, text):
    """A prompt ending in 中 as byte tokens, the completion's bytes ``written`` then "d": where they
    make the run not UTF-8, transformers decodes the whole run one U+FFFD a byte, the prompt's 中
    too (its text rewritten: no text of the completion's can follow it); the completion's text is
    its own bytes' share of it, one U+FFFD each (it was the whole's past the prompt's length: three
    U+FFFD for the one byte 0x80, six for 文 and 0x80). A run that stays UTF-8 is as before."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    prompt = [1, *reference.encode("Hello", add_special_tokens=False), *_bytes(tokenizer, "中".encode())]
    completion = [*_bytes(tokenizer, written), tokenizer.token_to_id("d")]
    shown = "中" if text == "文" else "\ufffd" * 3  # the prompt's run as the whole's decode shows it
    assert reference.decode(prompt + completion, skip_special_tokens=True) == "Hello" + shown + text + "d"
    assert _completed(codec, prompt, completion) == text + "d"


def _bytes(tokenizer: Tokenizer, written: bytes) -> list[int]:
    """The byte tokens that write ``written``."""
    return [tokenizer.token_to_id(f"<0x{b:02X}>") for b in written]


def test_random_byte_runs_across_the_prompts_end_read_as_transformers_decode_of_both():
    """Random prompts and completions of byte tokens (a run may cross the prompt's end: UTF-8 or
    not, a character cut short or not) and pieces: where transformers' decode of both begins with the
    prompt's, the completion's text is the rest, live and as the time limit's replay ends it. A
    prompt whose run was not UTF-8 already before its cut character (0xB8 then 0xE2 0xB8, completed
    by 0xB8) released the character (it was "", now one U+FFFD, as the whole run decodes)."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    byte = _bytes(tokenizer, bytes(range(256)))
    choices = [*byte[0x80:0xF5], *_bytes(tokenizer, "中".encode()) * 40, *map(tokenizer.token_to_id, ("▁", "d", "!"))]
    rng, sampling = random.Random(0), SamplingParams(max_tokens=5000)
    for _ in range(200):
        prompt = [rng.choice(choices) for _ in range(rng.randint(1, 8))]
        ids = [rng.choice(choices) for _ in range(rng.randint(1, 60))]
        whole, before = reference.decode(prompt + ids), reference.decode(prompt)
        text = _completed(codec, prompt, ids)
        assert CompletionText.replayed(codec, sampling, False, ids[:-1], prompt).end()[0] == _ending(
            codec, prompt, ids[:-1]
        )
        if whole.startswith(before):
            assert text == whole[len(before) :], (prompt, ids)


def _ending(codec: TextCodec, prompt: list[int], ids: list[int]) -> str:
    """What the end releases after ``ids`` pushed one by one after ``prompt``."""
    text = CompletionText(codec, SamplingParams(max_tokens=5000), False, prompt)
    for token in ids:
        text.push(token)
    return text.end()[0]
