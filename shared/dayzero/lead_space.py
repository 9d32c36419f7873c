"""A sentencepiece decoder's lead space: the space it drops where a decoded text begins (Llama's and
Mistral's ``Strip(" ", 1, 0)`` after ``Fuse``, ``Metaspace``'s prefix space), so that "▁world"
decoded alone reads "world" while the same token reads " world" after other text; and the prompt's
ids a completion's text is decoded after, so that it keeps that space after the prompt (``prompt_lead``)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from .byte_level import decoder_steps

if TYPE_CHECKING:
    from .ids_only_codec import IdsOnlyCodec
    from .tokenizer import TextCodec


def inner_tokenizer(tokenizer: Tokenizer, spec: dict) -> Tokenizer:
    """The tokenizer with a decoder that keeps a text's lead space: a token decoded alone reads as it
    does after other text. The tokenizer itself where its decoder drops none (byte-level ones, as
    DeepSeek's). ``spec``: the tokenizer's JSON (``byte_level.tokenizer_spec``)."""
    decoder = spec.get("decoder") or {}
    steps = decoder_steps(decoder)
    kept = [_keeping_lead_space(step) for step in steps]
    if kept == steps:
        return tokenizer
    inner = {**decoder, "decoders": kept} if "decoders" in decoder else kept[0]
    return Tokenizer.from_str(json.dumps({**spec, "decoder": inner}))


def _keeping_lead_space(step: dict) -> dict:
    """One decoding step without its drop of a text's leading space (a Strip's trailing cut stays)."""
    if step.get("type") == "Strip" and step.get("start"):
        return {**step, "start": 0}
    if step.get("type") == "Metaspace" and step.get("prepend_scheme", "always") != "never":
        return {**step, "prepend_scheme": "never"}
    return step


LEAD_TOKENS = 4  # the most prompt tokens a completion is decoded after (a character's UTF-8: 4 bytes at most)


def prompt_lead(codec: TextCodec | IdsOnlyCodec, prompt: Sequence[int]) -> tuple[list[int], int]:
    """The prompt's last ids a completion's text is decoded after (``StreamDecoder``'s ``after``),
    so that it reads as it does after the prompt: "▁world" after "Hello" is " world", as transformers'
    decode of prompt and completion together gives it. Its last shown tokens from the last one that
    begins a character (a run of byte tokens decodes whole: its UTF-8 from there), ``LEAD_TOKENS``
    at most. None where the decoder drops no lead space (byte-level ones, as DeepSeek's: the
    completion decodes alone, as it reads anyway) unless the prompt ends in a character cut short,
    nor where the prompt shows no text (the completion begins it: its lead space dropped, as in
    transformers' decode).

    And the characters ending their text that are a character cut short (``StreamDecoder``'s
    ``cut``): the completion's where its tokens complete it, as vLLM's detokenizer primed with the
    prompt holds it for them; one U+FFFD a byte in a run of byte tokens, else one. A prompt ending in
    a run of byte tokens that is not UTF-8 has none: its ids from where the run breaks
    (``TextCodec.run_break``) lead, and the completion's bytes go on with it, one U+FFFD each."""
    if not codec.has_tokenizer:
        return [], 0
    tail = list(prompt[-LEAD_TOKENS:])
    while len(tail) < len(prompt) and codec.in_run(tail):  # (the run of byte tokens that ends it, whole)
        tail = list(prompt[-2 * len(tail) :])
    if not codec.open_run(tail) and (broken := codec.run_break(tail)) < len(tail):
        # a run of byte tokens that is not UTF-8: the completion's bytes go on with it, one U+FFFD each
        return [token for token in tail[broken:] if codec.shown(token)], 0
    lead: list[int] = []
    for token in reversed(prompt):
        if not codec.shown(token):  # (left out of the text: a BOS, a template's special token)
            continue
        lead.append(token)
        first = codec.token_piece(token)[1][:1]
        if len(lead) == LEAD_TOKENS or not first or not 0x80 <= first[0] < 0xC0:  # (0x80-0xBF: a continuation)
            break
    lead.reverse()
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    utf8.decode(b"".join(codec.token_piece(token)[1] for token in lead))
    held = len(utf8.getstate()[0])  # [bytes] of a character cut short
    cut = held and (held if codec.open_run(lead) else 1)
    return (lead, cut) if codec.drops_lead_space or cut else ([], 0)
