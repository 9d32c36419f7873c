"""The chunk and body formats of each endpoint (OpenAI's), logprobs included.

Chat: ``choices[0].logprobs = {"content": [{token, logprob, bytes, top_logprobs}]}``.
Completions: ``choices[0].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}``;
with ``echo`` the text and the logprobs start with the prompt's (its first token's are null).
A token's string is its text as the response shows it ("▁world": " world", but "world" where it
begins the text, as a sentencepiece decoder strips it there: a completion's text follows its
prompt's, so only where the prompt shows no text); a piece of a multi-byte character
shows as U+FFFD in chat's entries, beside its bytes, and in the completions format, whose
``top_logprobs`` it keys, as OpenAI names it: ``bytes:\\xe4\\xb8``;
logprobs are the model's, before logit bias, penalties and temperature.

A chat's text is split as DeepSeek-V4 writes it (dayzero.chat.output): the reasoning before
``</think>`` is ``reasoning_content`` (thinking mode), DSML tool calls become ``tool_calls``
(``delta.tool_calls`` in streams: a call's id and name when its tag is complete, its arguments
when it closes; ``finish_reason: "tool_calls"``), and no DSML ever reaches ``content``; without
tools offered, the text after the reasoning is the content as written.
"""

from __future__ import annotations

import codecs

from dayzero.chat.output import AssistantStream, parse_message
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.lead_space import prompt_lead
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token
from dayzero.tokenizer import TextCodec

from .outcome import Usage


class Shape:
    """One request's response format; for streams, also where its completion text has reached."""

    def __init__(
        self,
        request: GenerationRequest,
        model: str,
        codec: TextCodec | IdsOnlyCodec,
        fingerprint: str | None = None,  # OpenAI's system_fingerprint (None: unknown, as OpenAI's may be)
    ) -> None:
        self.kind, self.model, self.created, self.codec = request.kind, model, int(request.created), codec
        self.fingerprint = fingerprint
        self.choice = request.choice  # the choice's index in a response of several
        self.id = f"{'chatcmpl' if request.kind == 'chat' else 'cmpl'}-{request.response_id or request.request_id}"
        self.logprobs = request.sampling.logprobs is not None
        self.prompt = request.prompt_ids if request.echo else None  # still to be echoed
        self.offset = 0  # characters of text covered by earlier chunks' logprobs
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # holds a character's first bytes
        # the prompt ends in a character cut short, its bytes held here till the completion's complete or
        # break it: its text is then the completion's, else the prompt's U+FFFD (lead_space.prompt_lead)
        self.cut = self.logprobs and not request.echo and _held_cut(self.utf8, codec, request.prompt_ids)
        # no token shown yet: the next one begins the text (``token_piece``'s opening, for logprobs'
        # names); a completion's text follows its prompt's where that shows any (lead_space.prompt_lead)
        self.opening = self.logprobs and not any(map(codec.shown, request.prompt_ids))
        self.thinking, self.tools, self.rid = request.thinking, request.tool_calls, request.request_id
        self.calls_only = request.calls_only
        self.parts = AssistantStream(self.thinking, self.tools, self.calls_only)  # a chat stream's text so far
        self.started = self.ended = 0  # tool calls of the stream begun / complete
        self.usage_chunk_follows = request.usage_in_stream  # OpenAI: then every chunk has "usage": null

    def _head(self, obj: str) -> dict:
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        return {**head, "system_fingerprint": self.fingerprint}

    def usage_chunk(self, used: Usage) -> dict:
        """OpenAI's last chunk of a stream that asked for usage (``stream_options.include_usage``)."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": used.body()}

    def chunk(
        self,
        text: str | None,
        finish: str | None,
        role: bool = False,
        tokens: list[Token] = (),
        cut: bool = False,
    ) -> dict | None:
        """The next chunk of a stream (None: nothing to say yet, e.g. text that may open a tag);
        ``cut``: the last before an error, which releases what a chat's parser holds (as "length")."""
        if self.kind == "chat":
            opened = {"role": "assistant", "content": "", "refusal": None}
            delta = opened if role else self._delta(text or "", finish, cut)
            if not (delta or finish or role or (self.logprobs and tokens)):
                return None
            choice, finish = {"index": self.choice, "delta": delta}, self._finish(finish, self.ended)
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": self.choice, "text": self._echo() + (text or "")}
            body = {**self._head("text_completion"), "choices": [choice]}
        # OpenAI's chunks carry both, null when there is nothing
        choice["logprobs"] = self._logprobs(tokens) if self.logprobs and tokens else None
        choice["finish_reason"] = finish
        self._ids_without_text(choice, tokens)
        self.prompt = None
        if self.usage_chunk_follows:
            body["usage"] = None
        return body

    def replay(self, token: Token) -> None:
        """A token a resumed stream sent before: it moves the chat's split, and its logprobs'
        place (past the text's opening; the completion's text offsets, its echoed prompt's
        first) on; nothing is emitted."""
        if self.kind == "chat":
            self._delta(token.text, None)
            if self.logprobs and token.logprob is not None:  # (its entry is not built: only its place)
                self._openings([token.token])
        elif self.logprobs:
            self._logprobs([token])
        self.prompt = None

    def body(self, text: str, finish: str, usage: dict, tokens: list[Token]) -> dict:
        if self.kind == "chat":
            parts = parse_message(text, self.thinking, finish == "stop", self.tools, self.calls_only)
            # the calls made, then one cut short (max_tokens): its id and name, as streamed
            calls = [self._call(i, c.name, c.arguments) for i, c in enumerate(parts.calls)]
            calls += [self._call(i, name) for i, name in enumerate(parts.started[len(calls) :], len(calls))]
            message = {"role": "assistant", "content": parts.content or (None if calls else ""), "refusal": None}
            if self.thinking:
                message["reasoning_content"] = parts.reasoning
            if calls:
                message["tool_calls"] = calls
            finish_reason = self._finish(finish, len(parts.calls))
            choice = {"index": self.choice, "message": message, "finish_reason": finish_reason}
            body = {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        else:
            choice = {"index": self.choice, "text": self._echo() + text, "finish_reason": finish}
            body = {**self._head("text_completion"), "choices": [choice], "usage": usage}
        choice["logprobs"] = self._logprobs(tokens) if self.logprobs else None  # OpenAI's: there, null unasked
        self._ids_without_text(choice, tokens)
        self.prompt = None
        return body

    def _ids_without_text(self, choice: dict, tokens: list[Token]) -> None:
        """A checkpoint without a tokenizer has no text to give: the ids themselves (vLLM's ``token_ids``),
        an echoed prompt's first, as its text would come first."""
        if not self.codec.has_tokenizer:
            echoed = list(self.prompt) if self.prompt is not None else []
            choice["token_ids"] = echoed + [t.token for t in tokens if t.token >= 0]  # not an ending's -1

    def _delta(self, text: str, finish: str | None, cut: bool = False) -> dict:
        """What ``text`` adds; ``finish``: it is the last, and why (a call left open at a "stop"
        ends there, one cut by "length" or an error (``cut``) stays without arguments)."""
        parts = self.parts.feed(text)
        if finish is not None or cut:
            parts = parts.then(self.parts.finish(stopped=finish == "stop"))
        delta: dict = {}
        if parts.reasoning:
            delta["reasoning_content"] = parts.reasoning
        if parts.content:
            delta["content"] = parts.content
        calls = [{"index": k, **self._call(k, name)} for k, name in enumerate(parts.started, self.started)]
        calls += [{"index": self.ended + i, "function": {"arguments": c.arguments}} for i, c in enumerate(parts.calls)]
        self.started, self.ended = self.started + len(parts.started), self.ended + len(parts.calls)
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _call(self, index: int, name: str, arguments: str = "") -> dict:
        """Call ``index`` of this choice (its id is the same in a resumed stream)."""
        return {
            "id": f"call_{self.rid[:16]}_{index}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def _finish(self, finish: str | None, calls: int) -> str | None:
        """A chat that ended after calling tools ends with "tool_calls" (OpenAI's reason)."""
        return "tool_calls" if finish == "stop" and calls else finish

    def _echo(self) -> str:
        """The prompt's text, in the first chunk (or the body) of an echoing completion."""
        return self.codec.decode(list(self.prompt)) if self.prompt is not None else ""

    def _logprobs(self, tokens: list[Token]) -> dict:
        """Each token named by its own text as the response shows it, special tokens included
        (``token_piece``: the first shown has no lead space where the decoder drops it); text
        offsets count the text the response shows, where special tokens are left out."""
        tokens = [t for t in tokens if t.logprob is not None]
        piece = self.codec.token_piece
        if self.kind == "chat":
            opens = self._openings([t.token for t in tokens])
            return {
                "content": [
                    {
                        **_entry(piece(t.token, o), t.logprob),
                        "top_logprobs": [_entry(piece(k, o), lp) for k, lp in t.top],
                    }
                    for t, o in zip(tokens, opens, strict=True)
                ]
            }
        ids, logprobs, alternatives = [t.token for t in tokens], [t.logprob for t in tokens], [t.top for t in tokens]
        first = tokens[0].prompt if tokens and tokens[0].index == 0 else None
        opens = []
        if self.prompt is not None and first is not None:  # echo: the prompt's tokens come first
            ids = list(self.prompt) + ids
            logprobs = [None] + [lp for lp, _ in first] + logprobs  # nothing predicts the first token
            alternatives = [None] + [alts for _, alts in first] + alternatives
            self.opening = True  # the prompt's first shown token begins the text
            opens = self._openings(list(self.prompt))  # (then the completion's follow them, as ``__init__`` says)
        opens += self._openings(ids[len(opens) :])
        name = self._legacy_name
        tops = [
            None if alts is None else {name(t, o): v for t, v in alts}
            for alts, o in zip(alternatives, opens, strict=True)
        ]
        offsets = []  # where each token's text begins; a character's bytes over several tokens: its start
        for token, opening in zip(ids, opens, strict=True):
            raw = self.codec.token_piece(token, opening)[1] if self.codec.shown(token) else b""
            before, text = self._cut_before(raw[:1]), self.utf8.decode(raw)
            prompts = int(self.cut and text.startswith("\ufffd"))  # (the prompt's cut character, broken)
            self.cut = self.cut and not (before or text)
            offsets.append(self.offset + max(0, before - prompts))
            self.offset += len(text) - prompts
        return {
            "tokens": [name(t, o) for t, o in zip(ids, opens, strict=True)],
            "token_logprobs": logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _cut_before(self, first: bytes) -> int:
        """Characters the text gains before ``first`` (a token's first byte) begins its own: the
        U+FFFD of held bytes it does not continue (a run of lead bytes, a cut character then "b");
        none where it goes on with them (a character's later bytes: its start)."""
        held = self.utf8.getstate()[0]  # (bytes Python's decoder still holds: ED BE as well, not yet U+FFFD)
        if not held or not first:
            return 0
        alone = len(held.decode(errors="replace"))
        return alone if len((held + first).decode(errors="replace")) > alone else 0  # else: it continues them

    def _openings(self, ids: list[int]) -> list[bool]:
        """Whether each of ``ids`` begins the text (no token shown before it), moving on past them."""
        opens = []
        for token in ids:
            opens.append(self.opening)
            self.opening = self.opening and not self.codec.shown(token)
        return opens

    def _legacy_name(self, token: int, opening: bool) -> str:
        """A token's name in the completions format, where names key ``top_logprobs``: its text, or
        for a piece of a character (U+FFFD as text) its bytes as OpenAI writes them, ``bytes:\\xe4``
        (two such pieces were one key, and one of them was lost)."""
        text, raw = self.codec.token_piece(token, opening)
        if "\ufffd" not in text or raw == text.encode():
            return text
        return "bytes:" + "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)


def _entry(piece: tuple[str, bytes], logprob: float) -> dict:
    return {"token": piece[0], "logprob": logprob, "bytes": list(piece[1])}


def _held_cut(utf8: codecs.IncrementalDecoder, codec: TextCodec | IdsOnlyCodec, prompt: tuple[int, ...]) -> bool:
    """Whether ``prompt`` ends in a character cut short whose bytes ``utf8`` now holds."""
    lead, cut = prompt_lead(codec, prompt)
    if cut:
        utf8.decode(b"".join(codec.token_piece(token)[1] for token in lead))
    return bool(cut and utf8.getstate()[0])
