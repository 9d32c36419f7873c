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
PARAMETER_CLOSE = f"</{DSML}parameter>"
_TAG = re.compile(  # the tags of a block, but a parameter's closing tag (its value is read up to it)
    rf'<{DSML}invoke\s+name="(?P<invoke>[^"<]*)"\s*>|</{DSML}invoke>|{BLOCK_CLOSE}'
    rf'|<{DSML}parameter\s+name="(?P<param>[^"<]*)"\s+string="(?P<string>true|false)"\s*>'
)
# text that may begin a DSML tag: held back from the content until the next characters decide
_MARKERS = ("\n\n<" + DSML, "\n\n</" + DSML, "\n\n" + DSML, "<" + DSML, "</" + DSML, DSML)
# what follows ``<｜DSML｜`` where a block begins (a bare invoke: calls written without their wrapper)
_BLOCK_TAGS = ("tool_calls>", "invoke")
_TAG_NAMES = ("tool_calls", "invoke", "parameter")
# a DSML tag outside a block that begins none (a closing tag, a parameter): dropped whole, once closed
_STRAY_TAG = re.compile(rf"(?:{'|'.join(_TAG_NAMES)})[^<>\n]*(?P<closed>>)?")


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


def _arguments(params: list[tuple[str, str, str]]) -> str:
    """An invoke's parameters (name, string flag, raw value) as a JSON object (a string="false"
    value that is not JSON stays a string).

    A string="false" value that is JSON is kept as the model wrote it, as DeepSeek's decoder keeps it:
    re-serialising it would lose digits (``0.1000000000000000055511`` -> ``0.1``) or write non-JSON
    (``1e400`` -> ``Infinity``). NaN / Infinity are not JSON: they stay strings."""
    values: dict[str, str] = {}  # key -> its value as JSON text
    for key, string, raw in params:
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


def parse_calls(block: str, ended: bool = True) -> tuple[list[str], list[ToolCall], int]:
    """A block's text read as DeepSeek's decoder reads it, tag after tag, a parameter's value up to
    its closing tag (so markup inside a value is the value's): the names of its invokes, its calls
    that ended, and where the block's closing tag ends (-1: not yet). A call ends at its closing tag,
    the next invoke, the block's close, or the text's end when ``ended``; its arguments are its
    complete parameters, so the k-th call always goes with the k-th name."""
    names: list[str] = []
    calls: list[ToolCall] = []
    params: list[tuple[str, str, str]] | None = None  # the open invoke's parameters
    at = 0
    while (tag := _TAG.search(block, at)) is not None:
        at = tag.end()
        if tag.group("param") is not None:
            close = block.find(PARAMETER_CLOSE, at)
            if close < 0:  # the text stops inside a value
                break
            if params is not None:
                params.append((tag.group("param"), tag.group("string"), block[at:close]))
            at = close + len(PARAMETER_CLOSE)
            continue
        if params is not None:  # anything else ends the open invoke
            calls.append(ToolCall(names[-1], _arguments(params)))
            params = None
        if tag.group("invoke") is not None:
            names.append(tag.group("invoke"))
            params = []
        elif tag.group(0) == BLOCK_CLOSE:
            return names, calls, at
    if params is not None and ended:
        calls.append(ToolCall(names[-1], _arguments(params)))
    return names, calls, -1


@dataclass(slots=True)
class Parsed:
    """What a piece of text released: content, calls completed, and the name of a call begun."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # names of calls whose invoke tag is complete


class ToolCallStream:
    """Feeds text in any pieces; content comes out as soon as it cannot be the start of a tag.

    A DSML token that begins no block (a bare token, a closing tag or a parameter outside a block)
    is dropped with its tag, and the text after it is content. Content after a block is set apart
    from the content before it by a blank line (the block's own)."""

    def __init__(self, calls_only: bool = False) -> None:
        self._calls_only = calls_only  # a grammar holds the text to calls: what it holds is their markup
        self._text = ""  # not yet released: a possible tag start, or an open block
        self._in_block = False
        self._done = 0  # invokes of the open block already reported complete
        self._started = 0  # invokes of the open block whose name was reported
        self._after_block = False  # a block just closed: the newlines after it are dropped, in any pieces
        self._wrote = False  # some content was released
        self._final = False  # the model ended its text: nothing waits for more

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
        self._final = stopped  # (a text cut by a limit keeps an undecided tag held: dropped below)
        out = self.feed("")
        if self._in_block and stopped:
            self._report(True, out)
        # a cut "<｜DS..." is markup, a cut "<" is not (but where only calls can be written); a reply
        # the model ended was not cut: what it holds is text (``｜DSML｜`` is one token, so the text
        # never stops inside it)
        if not self._in_block and (stopped or not (self._calls_only or DSML[0] in self._text)):
            self._release(out, self._text)
        self._text, self._in_block, self._final = "", False, False
        return out

    def _release(self, out: Parsed, content: str) -> None:
        out.content += content
        self._wrote = self._wrote or bool(content)

    def _step(self, out: Parsed) -> bool:
        if self._in_block:
            return self._block_step(out)
        if self._after_block:
            self._text = self._text.lstrip("\n")
            self._after_block = not self._text
            if self._text and self._wrote:
                self._release(out, "\n\n")
        at = self._text.find(DSML)
        if at < 0:
            hold = held_suffix(self._text, _MARKERS)
            self._release(out, self._text[: len(self._text) - hold])
            self._text = self._text[len(self._text) - hold :]
            return False
        prefix, rest = self._text[:at], self._text[at + len(DSML) :]
        opener = "</" if prefix.endswith("</") else "<" if prefix.endswith("<") else ""
        prefix = prefix[: len(prefix) - len(opener)]
        stray = _stray_tag(opener, rest, self._final)
        before = prefix.removesuffix("\n\n")  # content, whatever the tag (a block takes its blank line)
        self._release(out, before)
        if stray is None:  # the next characters decide
            self._text = self._text[len(before) :]
            return False
        if stray >= 0:  # dropped with its tag; the blank line before it may still open a block
            self._text = prefix[len(before) :] + rest[stray:]
            return True
        self._text, self._in_block, self._done, self._started = self._text[len(prefix) :], True, 0, 0
        return True

    def _block_step(self, out: Parsed) -> bool:
        end = self._report(False, out)
        if end < 0:
            return False
        self._text, self._in_block = self._text[end:], False
        self._after_block = True
        return True

    def _report(self, ended: bool, out: Parsed) -> int:
        """The calls of the open block not reported yet, begun and ended; where the block ends."""
        names, calls, end = parse_calls(self._text, ended)
        out.started.extend(names[self._started :])
        out.calls.extend(calls[self._done :])
        self._started, self._done = len(names), len(calls)
        return end


def _stray_tag(opener: str, rest: str, final: bool) -> int | None:
    """A DSML token (after ``opener``, before ``rest``): -1 when it begins a block, else the length of
    its tag's rest in ``rest`` (dropped with it; 0 for a bare token); None while more text could
    still decide (never once the model has ended its text: ``final``)."""
    if opener == "<" and rest.startswith(_BLOCK_TAGS):
        return -1
    tag = _STRAY_TAG.match(rest)
    if tag is not None and tag.group("closed"):
        return tag.end()
    begun = len(rest) if any(name.startswith(rest) for name in _TAG_NAMES) else 0  # a tag's name, begun
    begun = max(begun, tag.end() if tag is not None else 0)  # or a tag, not closed yet
    if final:
        return begun
    return None if begun == len(rest) else 0


def held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that could still grow into one of ``markers``."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
