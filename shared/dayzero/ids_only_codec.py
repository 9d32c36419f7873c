"""The codec of a checkpoint that ships no tokenizer.json: token ids in, token ids out, no text."""

from __future__ import annotations

from .chat.encoding import CHAT_MODE, ChatOptions


class NoTokenizerError(ValueError):
    """Text was given to a checkpoint that ships no tokenizer.json."""


class IdsOnlyCodec:
    """Stands in for ``TextCodec`` when a checkpoint ships no tokenizer.json (as a bare release
    download may): prompts must be token ids, completions are token ids without text."""

    chat_template = None
    has_tokenizer = False
    drops_lead_space = False

    def encode(self, text: str, limit: int | None = None, special: bool = True) -> list[int]:
        raise NoTokenizerError("this checkpoint has no tokenizer.json: send the prompt as token ids")

    def chat_prompt(self, messages: list[dict], options: ChatOptions = CHAT_MODE) -> str:
        raise NoTokenizerError("this checkpoint has no tokenizer.json: chats need one; send token ids to completions")

    def chat_ids(self, messages: list[dict], options: ChatOptions = CHAT_MODE, limit: int | None = None) -> list[int]:
        return self.encode(self.chat_prompt(messages, options))

    @property
    def guidance(self):
        raise NoTokenizerError("this checkpoint has no tokenizer.json: constrained decoding needs one")

    @property
    def grammars(self):
        return self.guidance

    def decode(self, ids: list[int]) -> str:
        return ""

    def decode_all(self, ids: list[int]) -> str:
        raise NoTokenizerError("this checkpoint has no tokenizer.json: token ids cannot be turned into text")

    def shown(self, token: int) -> bool:
        return False

    def token_id(self, token: str) -> int | None:
        return None

    def token_piece(self, token: int, opening: bool = False) -> tuple[str, bytes]:
        return "", b""
