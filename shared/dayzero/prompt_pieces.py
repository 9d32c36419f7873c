"""A long prompt tokenized in pieces, refused once their tokens reach the limit: space-free text under
the byte bound (base64, minified JSON) was tokenized whole to be refused (786,420 characters of base64
against a context of 65,536 on the demo tokenizer: 0.5 s), where the first pieces prove it.

A piece ends where an ASCII digit meets another printable ASCII character that is not a space (a
"digit edge"). There the pieces tokenize as the whole text does (their ids, concatenated, are the
whole text's) when the tokenizer has no normalizer and
- its pre-tokenizers begin with one that isolates digit runs (DeepSeek-V3's ``Split(\\p{N}{1,3})``):
  a digit edge is where its pieces meet, and each later one (Split, ByteLevel, ...) splits each
  piece alone; or
- its one pre-tokenizer is ByteLevel's GPT-2 regex without a prefix space (the demo's): a digit is
  only in `` ?\\p{N}+``, whose run a digit edge ends or begins, and the character on the other side,
  no space, ends or begins a match of its own (``\\p{L}+``, ``[^\\s\\p{L}\\p{N}]+``, ``'s``) that
  looks no further;
and its added tokens cannot span the edge: one of its two characters is in none of them (their
matcher takes the leftmost longest; none strips spaces or wants a word on its own). The pieces' ids
are joined between the special tokens the post-processor's template adds. Under ``\\p{N}{1,3}``
a run of digits is cut at a multiple of 3 digits into it too (``PieceCuts.group_cut``). Text with no
cut in the ``CUT_SEARCH`` characters past a piece's first ``PIECE_CHARACTERS`` is one piece (random
CJK; a digit string under GPT-2's regex, one pre-token: the whole text, as before).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from tokenizers import Tokenizer

from .byte_level import KEEPING_PRE_TOKENIZERS

PIECE_CHARACTERS = 1 << 14  # a piece is at least this long (~10 ms to tokenize), but for the last
CUT_SEARCH = 4 * PIECE_CHARACTERS  # characters searched for its end (none: the rest is one piece)
DIGITS_FIRST = {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False}
_OTHERS = "".join(sorted(set(string.printable) - set(string.digits) - set(string.whitespace)))


@dataclass(frozen=True, slots=True)
class PieceCuts:
    """Where a text may be cut into pieces that tokenize as the whole (``piece_cuts``), and the ids
    the post-processor puts around a text's (``before``, ``after``: its template's special tokens)."""

    edges: re.Pattern[str]  # matches the two characters of each digit edge no added token can span
    before: list[int]
    after: list[int]
    in_runs: int | None  # digits of a run a cut in it follows at least (``group_cut``); None: no such cut

    def ids_until(
        self, tokenizer: Tokenizer, text: str, limit: int, add_special_tokens: bool
    ) -> tuple[list[int], bool]:
        """``text``'s ids, as ``tokenizer`` gives them whole, and True; or, once its first pieces'
        tokens (with those the post-processor adds) reach ``limit``, theirs and False: the rest of
        it is never tokenized."""
        if len(text) <= PIECE_CHARACTERS:  # (one piece: as whole)
            return tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids, True
        ids = list(self.before) if add_special_tokens else []
        added = len(self.after) if add_special_tokens else 0
        start = 0
        while start < len(text) and len(ids) + added < limit:
            at_least = start + PIECE_CHARACTERS
            if at_least >= len(text):
                end = len(text)
            elif (end := self.group_cut(text, start, at_least)) is None:
                cut = self.edges.search(text, at_least - 1, at_least + CUT_SEARCH)
                end = cut.start() + 1 if cut else len(text)  # (between its two characters)
            ids += tokenizer.encode_batch_fast([text[start:end]], add_special_tokens=False)[0].ids  # GIL released
            start = end
        return ids + (self.after if add_special_tokens else []), start == len(text)

    def group_cut(self, text: str, start: int, at_least: int) -> int | None:
        """A cut from ``at_least`` on in the run of ASCII digits that reaches it, where ``\\p{N}{1,3}``
        splits it: a multiple of 3 digits into the run (from ``start``, a cut, where the run began
        before it), and ``in_runs`` digits in at least; None where ``text[at_least - 1]`` is no
        digit, or the run may begin with a digit that is not ASCII."""
        if self.in_runs is None:
            return None
        head = text[start:at_least]
        run = at_least - (len(head) - len(head.rstrip(string.digits)))  # (where the run begins)
        if run == at_least or (run > start and not text[run - 1].isascii()):
            return None
        cut = run + -(-max(at_least - run, self.in_runs) // 3) * 3
        return cut if cut < len(text) and not text[at_least : cut + 1].strip(string.digits) else None


def piece_cuts(tokenizer: Tokenizer, spec: dict) -> PieceCuts | None:
    """The digit edges where ``tokenizer``'s pieces tokenize as its whole text (the module's doc);
    None where that is not known: another normalizer or pre-tokenizer, added tokens that strip
    spaces or stand as words alone, a post-processor other than a template's (or ByteLevel's, which
    adds none), truncation or padding. ``spec``: its JSON (``byte_level.tokenizer_spec``)."""
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer") or {}
    splitters = pre.get("pretokenizers", [pre])
    gpt2 = pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
    digits_first = splitters[:1] == [DIGITS_FIRST] and {p.get("type") for p in splitters} <= KEEPING_PRE_TOKENIZERS
    added = tokenizer.get_added_tokens_decoder().values()
    around = specials_around(spec.get("post_processor"))
    if (
        (normalizer is not None and normalizer.get("normalizers") != [])  # (none, or an empty Sequence)
        or not (gpt2 or digits_first)
        or any(t.lstrip or t.rstrip or t.single_word for t in added)
        or around is None
        or spec.get("truncation") is not None
        or spec.get("padding") is not None
    ):
        return None
    in_added = set().union(*(t.content for t in added))
    digits, others = re.escape(string.digits), re.escape(_OTHERS)
    free_digits = re.escape("".join(c for c in string.digits if c not in in_added))
    free_others = re.escape("".join(c for c in _OTHERS if c not in in_added))
    sides = [(free_digits, others), (digits, free_others), (free_others, digits), (others, free_digits)]
    edges = "|".join(f"[{before}][{after}]" for before, after in sides if before and after)
    # inside a run of ASCII digits longer than any in an added token, none of which a digit begins or ends,
    # no added token fits (its run, between other characters, would be the text's)
    longest = max((len(r) for t in added for r in re.findall("[0-9]+", t.content)), default=0)
    ends = any(t.content[:1] in string.digits or t.content[-1:] in string.digits for t in added if t.content)
    in_runs = max(longest, 1) if digits_first and not ends else None
    return PieceCuts(re.compile(edges), *around, in_runs) if edges else None


def specials_around(post: dict | None) -> tuple[list[int], list[int]] | None:
    """The ids a post-processor puts before and after a text's: a template's special tokens on
    either side of its sequence; none for no post-processor or ByteLevel's; None for another, or a
    template that holds the text other than once ("$A $A", none: no before and after)."""
    if post is None or post.get("type") == "ByteLevel":
        return [], []
    if post.get("type") != "TemplateProcessing":
        return None
    items = [
        post["special_tokens"][i["SpecialToken"]["id"]]["ids"] if "SpecialToken" in i else None for i in post["single"]
    ]
    if items.count(None) != 1:
        return None
    at = items.index(None)  # (the sequence's place)
    return [i for ids in items[:at] for i in ids], [i for ids in items[at + 1 :] for i in ids]
