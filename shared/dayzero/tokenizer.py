"""Text <-> token ids through a checkpoint's ``tokenizer.json`` (the ``tokenizers`` library), and
chats -> prompt ids through the checkpoint's chat template or DeepSeek-V4's own encoding.

A chat template (``tokenizer_config.json``'s ``chat_template``, or ``chat_template.jinja``)
is rendered as transformers' ``apply_chat_template`` renders it (its own Jinja renderer), so a
checkpoint gets exactly the prompt format its authors ship (a message's content parts as the template
takes them: ``dayzero.chat.template_content``). A checkpoint without one (as
DeepSeek-V4 is released) gets V4's encoding (``dayzero.chat.encoding``).

Decoded text drops special tokens (as transformers' ``skip_special_tokens`` and vLLM do), except
the markers of V4's output protocol (``dayzero.chat.tokens.OUTPUT_MARKERS``): ``</think>`` and DSML
markup are how the model structures its answer, and the gateway parses them out.

Prompt text is refused before tokenizing when it is not Unicode the tokenizer can take (a lone
UTF-16 surrogate, as JSON's ``"\ud800"`` decodes) or when its UTF-8 size alone proves it longer
than a limit, and a long one when its head alone does (``dayzero.prompt_head``: only the head is
tokenized) or its first pieces do (``dayzero.prompt_pieces``: space-free text); tokenizing itself
runs without the GIL (the gateway's event loop goes on meanwhile).
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import json
from pathlib import Path

from tokenizers import Tokenizer

from .byte_level import byte_level_values, fallback_bytes, open_run, run_break, token_bytes, tokenizer_spec
from .chat.encoding import CHAT_MODE, ChatOptions, encode_chat
from .chat.prompts import effort_table_of
from .chat.tokens import OUTPUT_MARKERS
from .ids_only_codec import IdsOnlyCodec
from .lead_space import inner_tokenizer
from .prompt_head import tokens_of_head
from .prompt_pieces import piece_cuts

_TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class InvalidTextError(ValueError):
    """Prompt text that is not valid Unicode (a lone surrogate): no tokenizer can take it."""


class PromptTooLongError(ValueError):
    """A prompt whose UTF-8 size alone proves it has at least ``tokens`` tokens, ``limit`` or more."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"the prompt has at least {tokens} tokens; the context limit is {limit}")
        self.tokens, self.limit = tokens, limit


class TextCodec:
    """Encode prompts and decode completions, streaming-safe."""

    has_tokenizer = True

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None = None,
        tokens: dict | None = None,
        efforts: str | None = None,
    ) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.efforts = efforts  # the checkpoint's effort table (None: ChatOptions' default)
        self._tokens = tokens or {}  # special-token strings the template may use (bos_token, ...)
        special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        special |= {i for t in self._tokens.values() if (i := tokenizer.token_to_id(t)) is not None}
        self._hidden = special - {tokenizer.token_to_id(t) for t in OUTPUT_MARKERS}  # left out of decoded text
        spec = tokenizer_spec(tokenizer)
        self.token_bytes = token_bytes(tokenizer, spec)  # (None: no bound from a text's size)
        self.piece_cuts = piece_cuts(tokenizer, spec)  # (None: a long prompt is tokenized whole)
        self._fallback_bytes = fallback_bytes(tokenizer, spec)  # byte token -> its byte (a byte-fallback tokenizer)
        self._inner = inner_tokenizer(tokenizer, spec)  # decodes a token as it reads after other text
        self.drops_lead_space = self._inner is not tokenizer  # a text's lead space (lead_space.py)

    @classmethod
    def from_checkpoint(cls, root: str | Path) -> TextCodec:
        root = Path(root)
        path = root / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        config = root / "tokenizer_config.json"
        try:
            settings = json.loads(config.read_text()) if config.exists() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{config} is not valid JSON: {exc}") from exc
        if not isinstance(settings, dict):
            raise ValueError(f"{config} must hold a JSON object, got {type(settings).__name__}")
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (root / "chat_template.jinja").exists():
            template = (root / "chat_template.jinja").read_text()
        tokens = {k: _content(config, k, settings[k]) for k in _TEMPLATE_TOKENS if settings.get(k) is not None}
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception
            raise ValueError(f"{path} is not valid: {exc}") from exc
        tokenizer.no_truncation()  # (its ``truncation`` cut a prompt to fit, unsaid: it is refused instead)
        tokenizer.no_padding()  # (its ``padding`` filled a prompt with pad tokens)
        encoding = root / "encoding" / "encoding_dsv4.py"  # shipped beside the weights by DeepSeek
        efforts = effort_table_of(encoding.read_text() if encoding.exists() else None)
        return cls(tokenizer, template, tokens, efforts)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, limit: int | None = None, special: bool = True) -> list[int]:
        """Prompt ids (BOS added; ``special`` False: none); PromptTooLongError when the text's size
        alone (untokenized), its head's tokens (``prompt_head``) or its first pieces' (``prompt_pieces``)
        prove it has ``limit`` tokens or more (the exact count is the caller's)."""
        return self._ids(text, special, limit)

    def _ids(self, text: str, add_special_tokens: bool, limit: int | None) -> list[int]:
        try:
            size = len(text.encode())  # [UTF-8 bytes]
        except UnicodeEncodeError as exc:
            raise InvalidTextError(f"the text has a lone surrogate {text[exc.start]!r} (not Unicode)") from None
        if (
            limit is not None
            and size >= limit  # (fewer bytes prove nothing: a token holds a byte at least)
            and self.token_bytes
            and (at_least := self.token_bytes.least_tokens(text, size, limit)) >= limit
        ):
            raise PromptTooLongError(at_least, limit)
        count = functools.partial(self._count, add_special_tokens=add_special_tokens)
        if limit is not None and self.token_bytes and (from_head := tokens_of_head(text, limit, count)):
            raise PromptTooLongError(from_head, limit)
        if limit is not None and self.piece_cuts:  # (its pieces tokenize as it does: prompt_pieces.py)
            ids, whole = self.piece_cuts.ids_until(self._tok, text, limit, add_special_tokens)
            if not whole:
                raise PromptTooLongError(len(ids), limit)
            return ids
        return self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids  # GIL released

    def _count(self, text: str, add_special_tokens: bool) -> int:
        return len(self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids)

    def decode(self, ids: list[int]) -> str:
        """Generated text: special tokens left out, except the output protocol's markers."""
        return self._tok.decode([i for i in ids if i not in self._hidden], skip_special_tokens=False)

    def decode_all(self, ids: list[int]) -> str:
        """Every token's text, special tokens included (what the model was given)."""
        return self._tok.decode(ids, skip_special_tokens=False)

    def shown(self, token: int) -> bool:
        """Whether decoded text holds ``token`` (special tokens are left out: ``decode``; an id the
        tokenizer lacks, as a model's vocabulary padded past it has, decodes to nothing)."""
        return token in self._shown_ids or (token not in self._hidden and self._tok.id_to_token(token) is not None)

    @functools.cached_property
    def _shown_ids(self) -> frozenset[int]:
        """``shown``'s ids but those ``get_vocab`` (a piece -> id map) leaves out, once (a lookup per token;
        the tokenizer's ``id_to_token`` cost ~3x as much): a piece a Unigram vocabulary lists twice (as
        camembert's does) keeps one id there, and the tokenizer answers for the other. On first use, as
        walking a 129k vocabulary adds ~0.1 s to a codec that may never be asked (the gateway's start asks)."""
        return frozenset(self._tok.get_vocab(with_added_tokens=True).values()) - self._hidden

    def token_piece(self, token: int, opening: bool = False) -> tuple[str, bytes]:
        """One token as logprobs name it: its text where it follows other text (``opening``: where it
        begins one, as a sentencepiece decoder drops a lead space there: "▁world" reads "world"),
        special tokens included, and the bytes it stands for. A token holding part of a character's
        UTF-8 shows U+FFFD as text, and its bytes are that part (the entries' bytes concatenate to
        the output's UTF-8)."""
        decoding = self._tok if opening else self._inner
        if token in self._fallback_bytes:  # a byte-fallback tokenizer's <0xE4>
            byte = bytes([self._fallback_bytes[token]])
            if opening and not decoding.decode([token]):  # <0x20> beginning a text: dropped as a lead space
                return "", b""
            return byte.decode(errors="replace"), byte
        text = decoding.decode([token], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text, text.encode()
        piece, byte = self._tok.id_to_token(token) or "", byte_level_values()
        return text, bytes(byte[c] for c in piece) if all(c in byte for c in piece) else text.encode()

    def open_run(self, ids: list[int], known: int = 0) -> bool:
        """Whether ``ids`` end in a byte-fallback tokenizer's run of byte tokens (``<0xE4>``) whose
        bytes may still be UTF-8: none of its text is settled, whatever it decodes to (``byte_level.open_run``)."""
        return bool(self._fallback_bytes) and open_run(ids, self._fallback_bytes, self._hidden, known)

    def in_run(self, ids: list[int]) -> bool:
        """Whether ``ids`` are all byte tokens or left out: a run of byte tokens goes on through them."""
        return all(i in self._fallback_bytes or i in self._hidden for i in ids)

    def run_break(self, ids: list[int]) -> int:
        """Where to decode the rest of a run of byte tokens that is not UTF-8 from (``byte_level.run_break``)."""
        return run_break(ids, self._fallback_bytes, self._hidden) if self._fallback_bytes else len(ids)

    def unsettled(self, ids: list[int], text: str) -> int:
        """How many characters at the end of ``text`` (the text of ``ids``) a later token may still
        change: one U+FFFD where its UTF-8 ends in a character cut short (a lead byte short of the
        continuations it announces); a byte that begins no character is U+FFFD for good. A tokenizer
        neither lossless byte-level nor byte-fallback names no token's bytes: all of a text ending
        in U+FFFD."""
        if not text.endswith("\ufffd"):
            return 0
        if self.token_bytes is None and not self._fallback_bytes:
            return len(text)
        tail = b""  # a cut character is at most 3 bytes, and a lead byte begins a character: the last 4 decide
        for token in reversed(ids):
            if len(tail) >= 4:
                break
            tail = (b"" if token in self._hidden else self.token_piece(token)[1]) + tail
        held = codecs.getincrementaldecoder("utf-8")("replace")  # (it holds back exactly a cut character)
        held.decode(tail[-4:])
        return 1 if held.getstate()[0] else 0

    @functools.cached_property
    def guidance(self):
        """The tokenizer as llguidance sees it (built on first use; about a second for a large vocabulary)."""
        import llguidance

        eos = self._tok.token_to_id(self._tokens.get("eos_token", ""))
        return llguidance.LLTokenizer(self._tok.to_str(), eos_token=eos)

    @functools.cached_property
    def special_texts(self) -> tuple[str, ...]:
        """The special tokens' texts (a text spelling one is read as that token)."""
        return tuple(t.content for t in self._tok.get_added_tokens_decoder().values() if t.special and t.content)

    @functools.cached_property
    def grammars(self):
        """Constrained decoding's grammars over this tokenizer, compiled once each (guided.py)."""
        from .grammars import Grammars

        return Grammars(self.guidance)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def chat_prompt(self, messages: list[dict], options: ChatOptions = CHAT_MODE) -> str:
        """A chat ready for the assistant's answer, as prompt text (special tokens as text)."""
        if self.chat_template is None:
            if self.efforts is not None:
                options = dataclasses.replace(options, efforts=self.efforts)
            return encode_chat(messages, options)
        from transformers.utils.chat_template_utils import render_jinja_template

        from .chat.template_content import for_template  # (jinja2, as transformers: loaded on first use)

        # a list content: parts or one string
        shaped = for_template(messages, self.chat_template, self._tokens, bool(options.tools))
        kwargs = {"thinking": options.thinking, "reasoning_effort": options.effort, **self._tokens}
        prefix = bool(messages and messages[-1].get("prefix"))  # the answer's beginning, continued
        from jinja2 import TemplateError

        try:
            (text,), _ = render_jinja_template(
                conversations=[shaped],
                tools=list(options.tools) or None,
                chat_template=self.chat_template,
                add_generation_prompt=not prefix,
                continue_final_message=prefix,
                **kwargs,
            )
        except TemplateError as refused:  # its raise_exception ("roles must alternate"), an undefined's use
            raise ChatTemplateError(f"the checkpoint's chat template refused the messages: {refused}") from None
        except ValueError as refused:  # transformers': a prefix the template does not print, to continue
            raise ChatTemplateError(f"the checkpoint's chat template cannot continue the prefix: {refused}") from None
        except TypeError as failed:  # its operation on the chat's values (parts joined to a string)
            raise ChatTemplateError(f"the checkpoint's chat template failed on the messages: {failed}") from None
        return text

    def chat_ids(self, messages: list[dict], options: ChatOptions = CHAT_MODE, limit: int | None = None) -> list[int]:
        """A chat as prompt ids (the prompt text places its own special tokens: none are added);
        ``limit`` as for ``encode``."""
        return self._ids(self.chat_prompt(messages, options), False, limit)


class ChatTemplateError(ValueError):
    """The checkpoint's Jinja chat template refused a chat (the chat's fault, not the server's)."""


def load_codec(root: str | Path) -> TextCodec | IdsOnlyCodec:
    """The checkpoint's tokenizer, or token ids only when it ships none."""
    return TextCodec.from_checkpoint(root) if (Path(root) / "tokenizer.json").exists() else IdsOnlyCodec()


def _content(config: Path, key: str, token: str | dict) -> str:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    text = token.get("content") if isinstance(token, dict) else token
    if not isinstance(text, str):
        raise ValueError(f"{config}: {key} must be a string or an object with a string content, got {token!r}")
    return text
