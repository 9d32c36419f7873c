"""What a byte-level tokenizer (GPT-2's byte alphabet, as DeepSeek's) guarantees: the fewest tokens a
text can have, from the most UTF-8 bytes one token can stand for, and the byte each character of its
vocabulary writes; and a byte-fallback tokenizer's byte tokens (sentencepiece's ``<0xE4>``, as Llama's
and Mistral's)."""

from __future__ import annotations

import codecs
import functools
import json
import re
from dataclasses import dataclass

from tokenizers import Tokenizer, pre_tokenizers

KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation"}  # split text, drop none of it
STRETCH = 0  # ``added_finder``'s id for a stretch of text between added tokens


@dataclass(frozen=True, slots=True)
class TokenBytes:
    """The most UTF-8 bytes of text one token of a lossless byte-level tokenizer stands for: a token of
    its model (``plain``: a byte for each character of its string; the string's own UTF-8 counted "Ġ",
    a space, as 2) or an added token (``added``: its own text, matched only where the text holds it,
    so only where one of ``added_starts``, their first characters, is); and the added tokens as it
    finds them in a text (``added_finder``: its added tokens over a model that reads all other text as
    one token; ``added_bytes``: the finder's added token ids -> their texts' UTF-8 bytes, the fewest of
    them ``added_fewest``)."""

    plain: int
    added: int
    added_starts: str
    added_finder: Tokenizer
    added_bytes: dict[int, int]
    added_fewest: int

    def least_tokens(self, text: str, size: int, enough: int | None = None) -> int:
        """At least how many tokens ``text`` of ``size`` UTF-8 bytes has: ``plain`` bytes a token but
        for its added tokens, one each. Roughly first (an added token of ``added`` bytes may begin at
        each of its ``added_starts``); unless that proves ``enough``, or the added tokens it may hold
        cannot (each of ``added_fewest`` bytes), the added tokens the text holds."""
        starts = sum(map(text.count, self.added_starts))  # (the most added tokens it can hold)

        def least(added: int, added_size: int) -> int:  # with ``added`` added tokens of ``added_size`` bytes
            return added + -(-max(size - added_size, 0) // self.plain)

        # least() falls with each added token while one takes more bytes than a plain one, else it rises
        most = min(starts, -(-size // max(self.added, 1)))
        rough = min(least(0, 0), least(most, most * self.added))
        held = min(starts, size // max(self.added_fewest, 1))  # (the most it can hold, each of the fewest bytes)
        best = max(least(0, 0), least(held, held * self.added_fewest))  # (the most the added tokens found prove)
        if not starts or (enough is not None and not rough < enough <= best):
            return rough
        ids = self.added_finder.encode_batch_fast([text], add_special_tokens=False)[0].ids  # [pieces]
        found = [self.added_bytes[i] for i in ids if i in self.added_bytes]
        return least(len(found), sum(found))


def token_bytes(tokenizer: Tokenizer, spec: dict) -> TokenBytes | None:
    """What one token can stand for (``TokenBytes``), when the tokenizer is lossless byte-level (then
    no text has fewer tokens than ``TokenBytes.least_tokens``); None otherwise.

    Byte-level: a BPE model (a word model's one [UNK] stands for a word of any length), no normalizer,
    pre-tokenizers that split without dropping, ByteLevel's 256 byte characters all in the vocabulary,
    added tokens that absorb no neighbouring spaces. Then each byte of the text lands in exactly one
    token: a model token, whose string is ByteLevel's characters (one a byte; a string with any other
    character is never formed), or an added one, as its own text.
    ``spec``: the tokenizer's JSON (``tokenizer_spec``)."""
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer") or {}
    splitters = pre.get("pretokenizers", [pre])
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    lossless = (
        (spec.get("model") or {}).get("type") == "BPE"  # (a word model's [UNK] stands for a whole word)
        and (normalizer is None or normalizer.get("normalizers") == [])  # none, or an empty Sequence
        and "ByteLevel" in {p.get("type") for p in splitters}
        and all(p.get("type") in KEEPING_PRE_TOKENIZERS and p.get("behavior") != "Removed" for p in splitters)
        and all(c in vocab for c in pre_tokenizers.ByteLevel.alphabet())
        and not any(t.lstrip or t.rstrip for t in tokenizer.get_added_tokens_decoder().values())
    )
    if not lossless:
        return None
    alphabet = byte_level_values()
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content]
    plain = max(len(t) for t in tokenizer.get_vocab(with_added_tokens=False) if all(c in alphabet for c in t))
    starts = "".join(sorted({t[0] for t in added}))
    finder = added_finder(tokenizer, spec)
    # an added token "\x00" takes the stretches' id (its model's one word): counted with them, as model bytes
    added_bytes = {i: len(t.content.encode()) for i, t in finder.get_added_tokens_decoder().items() if i != STRETCH}
    fewest = min(filter(None, added_bytes.values()), default=0)  # (an empty added token is never found)
    return TokenBytes(plain, max(added_bytes.values(), default=0), starts, finder, added_bytes, fewest)


def added_finder(tokenizer: Tokenizer, spec: dict) -> Tokenizer:
    """``tokenizer``'s added tokens (its own matcher: the same tokens found in a text; ids of its own)
    over a model that reads each stretch of text between them as one token, ``STRETCH``: a text's added tokens
    for ~30 ms a MiB, with nothing else tokenized. ``spec``: its JSON, without a normalizer."""
    model = {"type": "WordLevel", "vocab": {"\x00": STRETCH}, "unk_token": "\x00"}
    parts = {"pre_tokenizer": None, "post_processor": None, "decoder": None, "truncation": None, "padding": None}
    finder = Tokenizer.from_str(json.dumps(spec | parts | {"model": model}))
    finder.encode_special_tokens = tokenizer.encode_special_tokens  # (True: special tokens read as text)
    return finder


def tokenizer_spec(tokenizer: Tokenizer) -> dict:
    """The tokenizer's JSON (its normalizer, pre-tokenizers, decoder), parsed once for both readers."""
    return json.loads(tokenizer.to_str())


def decoder_steps(decoder: dict) -> list[dict]:
    """A tokenizer JSON's decoder as its steps: a ``Sequence``'s ``decoders``, else the decoder alone."""
    return decoder.get("decoders", [decoder])


@functools.cache
def byte_level_values() -> dict[str, int]:
    """ByteLevel's vocabulary characters -> the bytes they write (GPT-2's table: printable bytes
    as themselves, the other bytes as the characters from U+0100 on, in byte order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(moved)}


def fallback_bytes(tokenizer: Tokenizer, spec: dict) -> dict[int, int]:
    """A byte-fallback tokenizer's byte tokens -> the byte each stands for: the ``<0xE4>`` tokens
    its ``ByteFallback`` decoder reads (a run of them decodes whole: its UTF-8, or one U+FFFD per
    byte where the run is not valid UTF-8); empty without that decoder. ``spec``: as ``token_bytes``'s."""
    decoder = spec.get("decoder") or {}
    if "ByteFallback" not in {d.get("type") for d in decoder_steps(decoder)}:
        return {}
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return {i: int(piece[3:5], 16) for piece, i in vocab.items() if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece)}


def open_run(ids: list[int], fallback: dict[int, int], hidden: set[int], known: int = 0) -> bool:
    """Whether ``ids`` end in a run of byte tokens (``fallback``'s, as ``fallback_bytes`` gives them;
    the ``hidden`` tokens, left out of the text, skipped) whose bytes may still be UTF-8: a later
    byte token may still change all of its run's text (one U+FFFD per byte where the run is not
    UTF-8: the run decodes whole), so none of it is settled. A run not UTF-8 already is settled.
    ``known``: ``ids[:known]`` end in such a run (the last call's answer): its bytes before its last
    character are UTF-8, so only those from that character on are read (a long run costs no more)."""
    run = bytearray()  # its bytes, the last first
    for at in range(len(ids) - 1, -1, -1):
        if (byte := fallback.get(ids[at])) is not None:
            run.append(byte)
            if at < known and not 0x80 <= byte < 0xC0:  # (the last character that begins in the known run)
                break
        elif ids[at] not in hidden:
            break
    try:
        codecs.utf_8_decode(bytes(run[::-1]), "strict", False)  # (a character cut short: no error)
    except UnicodeDecodeError:
        return False
    return bool(run)


def run_break(ids: list[int], fallback: dict[int, int], hidden: set[int]) -> int:
    """Where to begin decoding the run of byte tokens that ends ``ids``, not UTF-8 (not an
    ``open_run``), for its later bytes to decode as in the whole run (one U+FFFD each): the last
    place in it from which its bytes are not UTF-8 either (a byte no character begins with, or a
    character that breaks off). ``len(ids)`` where none is (no such run ends ``ids``)."""
    tail = bytearray()  # the run's bytes, the last first
    for at in range(len(ids) - 1, -1, -1):
        if ids[at] in hidden:
            continue
        if (byte := fallback.get(ids[at])) is None:
            break
        tail.append(byte)
        try:  # (the bytes after the character at ``at`` may still be UTF-8: that character decides)
            codecs.utf_8_decode(bytes(tail[-1:-5:-1]), "strict", False)
        except UnicodeDecodeError:
            return at
    return len(ids)
