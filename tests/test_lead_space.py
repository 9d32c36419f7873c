"""dayzero.lead_space through ``TextCodec.token_piece``: a sentencepiece tokenizer's token reads as
it does in the text (Llama's and Mistral's decoder: Replace "▁" -> " ", ByteFallback, Fuse,
Strip(" ", 1, 0)), against transformers' token strings and its decode of the whole."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from dayzero.tokenizer import TextCodec

SAMPLE = "Hello world  2023 中!"  # a double space ("▁", "▁world"), digits after a lone "▁", a byte run


def llama_style() -> Tokenizer:
    """A tiny sentencepiece-style BPE as Llama's and Mistral's tokenizer.json spell it."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", *"Helowrd023!"]
    merges = [("▁", "H"), ("l", "l"), ("ll", "o"), ("e", "llo"), ("▁H", "ello")]
    merges += [("▁", "w"), ("o", "r"), ("or", "l"), ("orl", "d"), ("▁w", "orld")]
    pieces += ["".join(pair) for pair in merges]
    model = models.BPE({p: i for i, p in enumerate(pieces)}, merges, unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.add_special_tokens(pieces[:3])  # (as Llama's added_tokens mark them: left out of decoded text)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def sentencepiece_bytes(reference: PreTrainedTokenizerFast, token: int) -> bytes:
    """A token's UTF-8 by sentencepiece's own rule: "▁" is a space, <0xE4> the byte it names."""
    string = reference.convert_ids_to_tokens(token)
    return bytes([int(string[3:5], 16)]) if string.startswith("<0x") else string.replace("▁", " ").encode()


def test_a_token_reads_as_in_the_text_with_its_space_but_at_the_texts_start():
    """ "▁world" read "world" (its space stripped as if it began the text), "▁" read "": a text's
    pieces joined to "Helloworld..." where it is "Hello world  ...". Where a token begins the text
    (``opening``) the decoder drops its lead space, as transformers' decode of the whole does."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    for token in range(3, tokenizer.get_vocab_size()):  # every piece but <unk>, <s>, </s>
        text, raw = codec.token_piece(token)
        assert raw == sentencepiece_bytes(reference, token), reference.convert_ids_to_tokens(token)
        assert text == raw.decode(errors="replace")
    ids = reference.encode(SAMPLE, add_special_tokens=False)
    assert reference.convert_ids_to_tokens(ids[:4]) == ["▁Hello", "▁world", "▁", "▁"]  # (the sample's shape)
    assert [codec.token_piece(t)[0] for t in ids[:3]] == [" Hello", " world", " "]  # were "Hello", "world", ""
    for start in range(len(ids)):  # the text that begins at each token: its first piece opening
        pieces = [codec.token_piece(ids[start], opening=True)] + [codec.token_piece(t) for t in ids[start + 1 :]]
        utf8 = b"".join(raw for _, raw in pieces)  # (from inside 中: its stray bytes, U+FFFD each)
        assert utf8.decode(errors="replace") == reference.decode(ids[start:]), start
    assert codec.token_piece(ids[0], opening=True) == ("Hello", b"Hello")


def test_a_lone_space_opening_the_text_takes_the_decoders_one_strip():
    """Strip(" ", 1, 0) drops one space: "▁" then "▁world" begin the text as "" and " world"."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids = reference.encode("  world", add_special_tokens=False)
    assert reference.convert_ids_to_tokens(ids) == ["▁", "▁", "▁world"]
    pieces = [codec.token_piece(ids[0], opening=True)] + [codec.token_piece(t) for t in ids[1:]]
    assert pieces == [("", b""), (" ", b" "), (" world", b" world")]
    assert "".join(text for text, _ in pieces) == reference.decode(ids) == "  world"


def test_a_metaspace_decoders_prefix_space_is_kept_after_other_text():
    """Metaspace (older sentencepiece conversions) drops the first token's lead space as Strip does."""
    tokenizer = Tokenizer(models.BPE({"▁a": 0, "▁": 1, "a": 2}, []))
    tokenizer.decoder = decoders.Metaspace()
    codec = TextCodec(tokenizer)
    assert tokenizer.decode([2, 0]) == "a a"  # (the reference: its space is there after other text)
    assert codec.token_piece(0) == (" a", b" a") and codec.token_piece(0, opening=True) == ("a", b"a")
