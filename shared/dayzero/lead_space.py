"""A sentencepiece decoder's lead space: the space it drops where a decoded text begins (Llama's and
Mistral's ``Strip(" ", 1, 0)`` after ``Fuse``, ``Metaspace``'s prefix space), so that "▁world"
decoded alone reads "world" while the same token reads " world" after other text."""

from __future__ import annotations

import json

from tokenizers import Tokenizer


def inner_tokenizer(tokenizer: Tokenizer, spec: dict) -> Tokenizer:
    """The tokenizer with a decoder that keeps a text's lead space: a token decoded alone reads as it
    does after other text. The tokenizer itself where its decoder drops none (byte-level ones, as
    DeepSeek's). ``spec``: the tokenizer's JSON (``byte_level.tokenizer_spec``)."""
    decoder = spec.get("decoder") or {}
    steps = decoder.get("decoders", [decoder])
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
