"""Text <-> token ids through a checkpoint's ``tokenizer.json`` (the ``tokenizers`` library), and
chats -> prompt ids through the checkpoint's chat template or DeepSeek-V4's own encoding.

A chat template (``tokenizer_config.json``'s ``chat_template``, or ``chat_template.jinja``)
is rendered as transformers' ``apply_chat_template`` renders it (its own Jinja renderer), so a
checkpoint gets exactly the prompt format its authors ship. A checkpoint without one (as
DeepSeek-V4 is released) gets V4's encoding (``dayzero.chat.encoding``).

Decoded text keeps special tokens other than BOS / EOS / padding: ``</think>`` and DSML markup
are how the model structures its answer, and the gateway parses them out.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Tokenizer

from .chat.encoding import CHAT_MODE, ChatOptions, encode_chat

_TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TextCodec:
    """Encode prompts and decode completions, streaming-safe."""

    has_tokenizer = True

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None, tokens: dict | None = None) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self._tokens = tokens or {}  # special-token strings the template may use (bos_token, ...)
        self._hidden = {i for t in self._tokens.values() if (i := tokenizer.token_to_id(t)) is not None}

    @classmethod
    def from_checkpoint(cls, root: str | Path) -> TextCodec:
        root = Path(root)
        path = root / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        config = root / "tokenizer_config.json"
        settings = json.loads(config.read_text()) if config.exists() else {}
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (root / "chat_template.jinja").exists():
            template = (root / "chat_template.jinja").read_text()
        tokens = {k: _content(settings[k]) for k in _TEMPLATE_TOKENS if settings.get(k) is not None}
        return cls(Tokenizer.from_file(str(path)), template, tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        """Generated text: special tokens kept, except BOS / EOS / padding."""
        return self._tok.decode([i for i in ids if i not in self._hidden], skip_special_tokens=False)

    def decode_all(self, ids: list[int]) -> str:
        """Every token's text, special tokens included (what the model was given)."""
        return self._tok.decode(ids, skip_special_tokens=False)

    @functools.cached_property
    def guidance(self):
        """The tokenizer as llguidance sees it (built on first use; about a second for a large vocabulary)."""
        import llguidance

        eos = self._tok.token_to_id(self._tokens.get("eos_token", ""))
        return llguidance.LLTokenizer(self._tok.to_str(), eos_token=eos)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def chat_prompt(self, messages: list[dict], options: ChatOptions = CHAT_MODE) -> str:
        """A chat ready for the assistant's answer, as prompt text (special tokens as text)."""
        if self.chat_template is None:
            return encode_chat(messages, options)
        from transformers.utils.chat_template_utils import render_jinja_template

        flat = [{**m, "content": "".join(m["content"])} if isinstance(m.get("content"), list) else m for m in messages]
        kwargs = {"thinking": options.thinking, "reasoning_effort": options.effort, **self._tokens}
        prefix = bool(messages and messages[-1].get("prefix"))  # the answer's beginning, continued
        (text,), _ = render_jinja_template(
            conversations=[flat],
            tools=list(options.tools) or None,
            chat_template=self.chat_template,
            add_generation_prompt=not prefix,
            continue_final_message=prefix,
            **kwargs,
        )
        return text

    def chat_ids(self, messages: list[dict], options: ChatOptions = CHAT_MODE) -> list[int]:
        """A chat as prompt ids (the prompt text places its own special tokens: none are added)."""
        return self._tok.encode(self.chat_prompt(messages, options), add_special_tokens=False).ids


class NoTokenizerError(ValueError):
    """Text was given to a checkpoint that ships no tokenizer.json."""


class IdsOnlyCodec:
    """Stands in for ``TextCodec`` when a checkpoint ships no tokenizer.json (as a bare release
    download may): prompts must be token ids, completions are token ids without text."""

    chat_template = None
    has_tokenizer = False

    def encode(self, text: str) -> list[int]:
        raise NoTokenizerError("this checkpoint has no tokenizer.json: send the prompt as token ids")

    def chat_prompt(self, messages: list[dict], options: ChatOptions = CHAT_MODE) -> str:
        raise NoTokenizerError("this checkpoint has no tokenizer.json: chats need one; send token ids to completions")

    def chat_ids(self, messages: list[dict], options: ChatOptions = CHAT_MODE) -> list[int]:
        return self.encode(self.chat_prompt(messages, options))

    @property
    def guidance(self):
        raise NoTokenizerError("this checkpoint has no tokenizer.json: constrained decoding needs one")

    def decode(self, ids: list[int]) -> str:
        return ""

    def decode_all(self, ids: list[int]) -> str:
        raise NoTokenizerError("this checkpoint has no tokenizer.json: token ids cannot be turned into text")

    def token_id(self, token: str) -> int | None:
        return None


def load_codec(root: str | Path) -> TextCodec | IdsOnlyCodec:
    """The checkpoint's tokenizer, or token ids only when it ships none."""
    return TextCodec.from_checkpoint(root) if (Path(root) / "tokenizer.json").exists() else IdsOnlyCodec()


def _content(token: str | dict) -> str:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else token


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
