"""DSML, DeepSeek-V4's tool-call markup: rendering calls into a prompt, and parsing the model's
calls out of its text, also while it streams.

A block is ``<｜DSML｜tool_calls>`` + one ``<｜DSML｜invoke name="NAME">`` per call holding
``<｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>`` lines (string="true":
the value as is; false: JSON), each element on its own line. ``ToolCallStream`` splits text into
content and calls; no DSML ever reaches the content, also when the text stops inside a tag.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .tokens import DSML

BLOCK_OPEN, BLOCK_CLOSE = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
OPENINGS = ("\n\n" + BLOCK_OPEN, BLOCK_OPEN)  # how a reply's calls begin (V4 writes a blank line first)
INVOKE_CLOSE = f"</{DSML}invoke>"
_INVOKE_HEAD = re.compile(rf'<{DSML}invoke\s+name="([^"]*)"\s*>')
_PARAMETER = re.compile(
    rf'<{DSML}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>(.*?)</{DSML}parameter>', re.DOTALL
)
# text that may begin a DSML tag: held back from the content until the next characters decide
_MARKERS = ("\n\n<" + DSML, "\n\n</" + DSML, "<" + DSML, "</" + DSML, DSML)


def to_json(value: object) -> str:
    """JSON as DeepSeek's encoding writes it (", " and ": ", characters unescaped)."""
    return json.dumps(value, ensure_ascii=False)


def render_calls(calls: list[dict]) -> str:
    """OpenAI ``tool_calls`` of an assistant turn as the block that ends its text ("" for none)."""
    if not calls:
        return ""
    invokes = [_render_invoke(c["function"]["name"], c["function"].get("arguments") or "{}") for c in calls]
    return "\n\n" + BLOCK_OPEN + "\n" + "\n".join(invokes) + "\n" + BLOCK_CLOSE


def _render_invoke(name: str, arguments: str) -> str:
    try:
        values = json.loads(arguments)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's recursion limit
        values = None
    if not isinstance(values, dict):
        values = {"arguments": arguments}
    params = [
        f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{v if isinstance(v, str) else to_json(v)}</{DSML}parameter>"
        for k, v in values.items()
    ]
    return f'<{DSML}invoke name="{name}">\n' + "\n".join(params) + f"\n</{DSML}invoke>"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object


def arguments_of(body: str) -> str:
    """An invoke's parameters as a JSON object (a string="false" value that is not JSON stays a string).

    A string="false" value that is JSON is kept as the model wrote it, as DeepSeek's decoder keeps it:
    re-serialising it would lose digits (``0.1000000000000000055511`` -> ``0.1``) or write non-JSON
    (``1e400`` -> ``Infinity``). NaN / Infinity are not JSON: they stay strings."""
    values: dict[str, str] = {}  # key -> its value as JSON text
    for key, string, raw in _PARAMETER.findall(body):
        values[key] = to_json(raw) if string == "true" else _json_text(raw)
    return "{" + ", ".join(f"{to_json(k)}: {v}" for k, v in values.items()) + "}"


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def _json_text(raw: str) -> str:
    try:
        json.loads(raw, parse_constant=_not_json)
    except (ValueError, RecursionError):  # JSONDecodeError too; the model's text may nest past the limit
        return to_json(raw)
    return raw.strip()


def parse_calls(block: str, ended: bool = True) -> tuple[list[str], list[ToolCall]]:
    """The names of a block's invokes, and its calls that ended: by their closing tag, or by what
    follows them (the next invoke, or the block's end when ``ended``). A call's arguments are its
    complete parameters, so the k-th call is always the k-th name."""
    heads = list(_INVOKE_HEAD.finditer(block))
    calls = []
    for i, head in enumerate(heads):
        body = block[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(block)]
        close = body.find(INVOKE_CLOSE)
        if close < 0 and i + 1 == len(heads) and not ended:
            break
        calls.append(ToolCall(head.group(1), arguments_of(body if close < 0 else body[:close])))
    return [h.group(1) for h in heads], calls


@dataclass(slots=True)
class Parsed:
    """What a piece of text released: content, calls completed, and the name of a call begun."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # names of calls whose invoke tag is complete


class ToolCallStream:
    """Feeds text in any pieces; content comes out as soon as it cannot be the start of a tag."""

    def __init__(self) -> None:
        self._text = ""  # not yet released: a possible tag start, or an open block
        self._in_block = False
        self._done = 0  # invokes of the open block already reported complete
        self._started = 0  # invokes of the open block whose name was reported
        self._after_block = False  # a block just closed: the newlines after it are dropped, in any pieces

    def feed(self, text: str) -> Parsed:
        self._text += text
        out = Parsed()
        while self._step(out):
            pass
        return out

    def finish(self, stopped: bool = False) -> Parsed:
        """The end of the text: what is held and is no markup becomes content; a cut block is dropped.
        ``stopped``: the model ended its reply (not a limit), so a call it left open ends there, with
        its complete parameters; else it stays begun only (a call cut by ``max_tokens``)."""
        out = self.feed("")
        if self._in_block and stopped:
            self._report(self._text, True, out)
        # a cut "<｜DS..." is markup, a cut "<" is not; a reply the model ended was not cut: what it
        # holds is text (``｜DSML｜`` is one token, so the text never stops inside it)
        if not self._in_block and (stopped or DSML[0] not in self._text):
            out.content += self._text
        self._text, self._in_block = "", False
        return out

    def _step(self, out: Parsed) -> bool:
        if self._in_block:
            return self._block_step(out)
        if self._after_block:
            self._text = self._text.lstrip("\n")
            self._after_block = not self._text
        at = self._text.find(DSML)
        if at < 0:
            hold = held_suffix(self._text, _MARKERS)
            out.content += self._text[: len(self._text) - hold]
            self._text = self._text[len(self._text) - hold :]
            return False
        prefix = self._text[:at]
        opener = "</" if prefix.endswith("</") else "<" if prefix.endswith("<") else ""
        prefix = prefix[: len(prefix) - len(opener)]
        out.content += prefix.removesuffix("\n\n")
        self._text, self._in_block, self._done, self._started = self._text[len(prefix) :], True, 0, 0
        return True

    def _block_step(self, out: Parsed) -> bool:
        end = self._text.find(BLOCK_CLOSE)
        self._report(self._text if end < 0 else self._text[:end], end >= 0, out)
        if end < 0:
            return False
        self._text, self._in_block = self._text[end + len(BLOCK_CLOSE) :], False
        self._after_block = True
        return True

    def _report(self, block: str, ended: bool, out: Parsed) -> None:
        """The calls of the open block not reported yet: begun, and ended."""
        heads, calls = parse_calls(block, ended)
        out.started.extend(heads[self._started :])
        out.calls.extend(calls[self._done :])
        self._started, self._done = len(heads), len(calls)


def held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that could still grow into one of ``markers``."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
