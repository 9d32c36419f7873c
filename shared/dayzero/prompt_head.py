"""A long prompt's head, tokenized before the whole: a text far past a token limit is refused after
tokenizing a few times the limit in characters, not all of it (a 118 KB prompt against a context
of 4,096: 32,451 tokens counted to be refused, where its UTF-8 size alone proved nothing).

The head ends where a word ends and a space begins, so a byte-level tokenizer whose pre-tokenizers
split at spaces (GPT's and DeepSeek's regexes) splits it as it splits the whole text there: the
head's tokens are the whole text's first ones. ``CUT_SLACK`` covers a pre-tokenizer that splits
elsewhere (the head's last word cut, each of its bytes a token at worst).
"""

from __future__ import annotations

from collections.abc import Callable

HEAD_CHARACTERS_PER_TOKEN = 8  # the head: this many characters a token of the limit
CUT_SLACK = 64  # tokens the cut may add to the head's count
_WORD_SEARCH = 256  # characters before the head's end searched for a word's end


def tokens_of_head(text: str, limit: int, count: Callable[[str], int]) -> int | None:
    """At least how many tokens ``text`` has by its head (``count``: its tokens), when that is
    ``limit`` or more; None when the head proves nothing or the text is not twice the head (then
    counting the whole costs at most twice the head's)."""
    near = limit * HEAD_CHARACTERS_PER_TOKEN
    if len(text) < 2 * near or (cut := _word_end(text, near)) is None:
        return None
    least = count(text[:cut]) - CUT_SLACK
    return least if least >= limit else None


def _word_end(text: str, near: int) -> int | None:
    """A position before ``near`` where a space follows a character that is not one; None when
    there is none in the ``_WORD_SEARCH`` characters before it."""
    at = near
    while (at := text.rfind(" ", max(near - _WORD_SEARCH, 1), at)) > 0:
        if not text[at - 1].isspace():
            return at
    return None
