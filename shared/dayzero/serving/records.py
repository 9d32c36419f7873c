"""The token-stream record: one entry of ``tokens:{id}`` in Redis, written by the stages and read
by the gateway, encoded and decoded here only.

Fields: i index, t token (-1: an ending without a token), x text, f finish reason, u usage (JSON),
e error, c the error's code (OpenAI's ``code``: no_worker, overloaded, grammar_failed), l logprob,
k top alternatives (JSON), p the prompt's logprobs (JSON, on the first token).
The entry id is ``{index + 1}-0``, so Redis itself refuses a duplicate or out-of-order append.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..params import Logprob

if TYPE_CHECKING:
    from ..completion import Step


@dataclass(frozen=True, slots=True)
class Token:
    """Token ``index`` of a request and the text it released; on the last entry the finish reason
    (and usage, or the error that ended it)."""

    request_id: str
    index: int
    token: int
    text: str
    finish_reason: str | None = None
    usage: dict | None = None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    prompt: list[Logprob] | None = None  # on the first token: the prompt's logprobs, when asked for
    error: str = ""
    code: str = ""  # the error's kind, when the gateway answers it other than a failed generation

    @property
    def entry_id(self) -> str:
        return entry_id(self.index)

    @classmethod
    def of(
        cls, request_id: str, index: int, step: Step, usage: dict | None = None, prompt: list[Logprob] | None = None
    ) -> Token:
        return cls(request_id, index, step.token, step.text, step.finish_reason, usage, step.logprob, step.top, prompt)


def entry_id(index: int) -> str:
    return f"{index + 1}-0"


def ending(
    request_id: str,
    index: int,
    reason: str,
    message: str = "",
    usage: dict | None = None,
    code: str = "",
    text: str = "",
) -> Token:
    """The entry that closes a stream without a token (cancelled, error, a time limit's length) at
    ``index``; ``text``: what its completion held back till then (a time limit's)."""
    return Token(request_id, index, -1, text, reason, usage, error=message, code=code)


def encode(t: Token) -> dict[str, str | int]:
    fields: dict[str, str | int] = {"i": t.index, "t": t.token, "x": t.text}
    if t.finish_reason:
        fields["f"] = t.finish_reason
    if t.usage:
        fields["u"] = json.dumps(t.usage)
    if t.logprob is not None:
        fields["l"] = repr(t.logprob)
        fields["k"] = json.dumps(t.top)
    if t.prompt is not None:
        fields["p"] = json.dumps(t.prompt)
    if t.error:
        fields["e"] = t.error
    if t.code:
        fields["c"] = t.code
    return fields


def decode(request_id: str, fields: dict[bytes, bytes]) -> Token:
    return Token(
        request_id,
        int(fields[b"i"]),
        int(fields[b"t"]),
        fields[b"x"].decode(),
        fields[b"f"].decode() if b"f" in fields else None,
        json.loads(fields[b"u"]) if b"u" in fields else None,
        float(fields[b"l"]) if b"l" in fields else None,
        tuple(map(tuple, json.loads(fields[b"k"]))) if b"k" in fields else (),
        [(lp, tuple(map(tuple, top))) for lp, top in json.loads(fields[b"p"])] if b"p" in fields else None,
        fields.get(b"e", b"").decode(),
        fields.get(b"c", b"").decode(),
    )
