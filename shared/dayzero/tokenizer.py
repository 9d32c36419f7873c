"""Text <-> token ids through a checkpoint's ``tokenizer.json`` (the ``tokenizers`` library)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TextCodec:
    """Encode prompts and decode completions, streaming-safe."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def from_checkpoint(cls, root: str | Path) -> TextCodec:
        path = Path(root) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        return cls(Tokenizer.from_file(str(path)))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class StreamDecoder:
    """Turns a growing list of ids into text deltas, holding back incomplete UTF-8."""

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []
        self._emitted = 0
        self.text = ""

    def push(self, token: int) -> str:
        self._ids.append(token)
        text = self._codec.decode(self._ids)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        delta, self.text = text[self._emitted :], text
        self._emitted = len(text)
        return delta
