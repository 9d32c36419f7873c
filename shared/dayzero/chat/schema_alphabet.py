"""The byte classes llguidance's lexer tells apart (its alphabet), as it counts them: every byte a
lexeme spells as itself (a literal's, a one-byte range's) is a class of its own, and the other
bytes fall in classes by the byte sets that hold them (derivre's ``ByteCompressor``). A grammar's
lexemes are its names, enum and const values and patterns as JSON strings write them (a class, a
``.``, as UTF-8 byte ranges, the characters a JSON string escapes as their escapes), and the JSON
rules its types use (a string's, a number's, an open object's any value). Swept against llguidance
1.9.1's own count (140 schemas: enums, names and patterns of ASCII, Cyrillic, CJK, classes, case
folding, escapes, numbers; open and closed), 132 were counted exactly, 4 two or three classes over
(a bounded integer's digits, each its own; case folding), none under; a format is counted by the
byte sets of llguidance's regular expression for it (exactly, each alone beside a run: it was
counted as printable ASCII, 45-64 classes over). A pattern this reader does not follow (a Unicode
class ``\\p{L}``, a class within a class) is counted as telling all 256 bytes apart."""

from __future__ import annotations

import functools
import re
import string

from .dsml import render_calls, to_json
from .schema_atoms import ANY, Ranges, Unread, atoms, complement

_SURROGATES = (0xD800, 0xDFFF)
# the bytes a forced call's DSML tags spell
_CALL_BYTES = frozenset(render_calls([{"function": {"name": "f", "arguments": '{"a": "", "b": 1}'}}]).encode())
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_SHORT_CODES = {escape: code for code, escape in _SHORT_ESCAPES.items()}
# a control character a literal's JSON text escapes (``\\t``, ``\\u001f``; DEL as it is), which llguidance
# also reads coded, in either case (``\\u0009``, ``\\u001F``)
_CONTROL = re.compile(r"(?<!\\)(?:\\\\)*\\(?:([bfnrt])|u(00[01][0-9a-f]))|\x7f")
_ANCHORED = re.compile(r"(?:\(\?[A-Za-z-]*\))*\^.*(?<!\\)(?:\\\\)*\$", re.DOTALL)  # ((?i)^...$, not ...\$)
# the byte sets each string format's regular expression tells apart, as atoms of one (its literal
# bytes, then its classes): read off llguidance 1.9's expressions (parser/src/json/formats.rs), the
# formats it enforces (schema_openapi.KNOWN_FORMATS; it writes one it does not know, dropped, as any string)
_FORMAT_CLASSES = {
    "date": r"-0123[01][02][12][469][13578][1-9][0-9]",
    "date-time": r"-\.01236:[+\-][01][02][12][Tt][Zz][469][0-3][13578][0-5][1-9][0-9]",
    "duration": r"DHMPSTWY[0-9]",
    "email": r"\.125@\[\][0-4][0-5][1-9][0-9][0-9A-Za-z][\-0-9A-Za-z][!#$%&'*+\-/0-9=?A-Z\^_`a-z{|}~]",
    "hostname": r"\.[0-9A-Za-z][\-0-9A-Za-z]",
    "ipv4": r"\.125[0-4][0-5][1-9][0-9]",
    "ipv6": r":[0-9A-Fa-f]",
    "time": r"\.026:[+\-][01][Zz][0-3][0-5][0-9]",
    "uri": r"#%\./125:\?@\[\]v[0-4][0-5][1-9][0-9][0-9A-Fa-f][A-Za-z][+\-.0-9A-Za-z][!$&'()*+,\-.0-9;=A-Z_a-z~]"
    r"[!$&'()*+,\-.0-9:;=A-Z_a-z~][!$&'()*+,\-.0-9:;=@A-Z_a-z~][!$&'()*+,\-./0-9:;=?@A-Z_a-z~]",
    "uuid": r"-[0-9A-Fa-f]",
}
_KINDS = ["object", "array", "string", "number", "integer", "boolean", "null"]  # (no type: any)


class Alphabet:
    """The byte classes of one grammar's lexemes, added lexeme by lexeme."""

    def __init__(self, calls: tuple[str, ...] = ()) -> None:
        """``calls``: the names of the tools whose calls the grammar writes (their tags: DSML's and
        each name's, ``invoke name="..."``; a string parameter's raw text but "<")."""
        self.masks: set[int] = {_mask(" \n\r\t")}  # its byte sets, as 256-bit masks (white space)
        self.add_bytes(b'{},: "')  # (punctuation; the separators ", " and ": ")
        self.masks |= _utf8_masks(tuple(_without(ANY)))  # (the string rule of dayzero's grammar, unescaped)
        if calls:
            self.add_bytes(_CALL_BYTES | frozenset("".join(calls).encode()))
            self.masks |= _utf8_masks(tuple(complement([(ord("<"), ord("<"))])))
        self.every_byte = False

    def classes(self) -> int:
        """The classes the bytes fall in: each byte a set of one holds its own, the rest by the sets
        holding them."""
        if self.every_byte:
            return 256
        singles = sum(mask for mask in self.masks if not mask & (mask - 1))
        sets = [mask for mask in self.masks if mask & (mask - 1)]
        rest = [byte for byte in range(256) if not singles >> byte & 1]
        return singles.bit_count() + len({sum(1 << i for i, s in enumerate(sets) if s >> b & 1) for b in rest})

    def add_bytes(self, text: bytes) -> None:
        """Bytes a lexeme spells as themselves."""
        self.masks.update(1 << byte for byte in text)

    def add_literal(self, value: object) -> None:
        """A value a grammar writes as it is (a name, an enum or const value): its JSON text's bytes."""
        text = to_json(value)
        self.add_bytes(text.encode(errors="surrogatepass"))
        for control in _CONTROL.finditer(text):  # (its control characters coded too: \t as \u0009)
            code = _SHORT_CODES[control[1]] if control[1] else int(control[2], 16) if control[2] else 0x7F
            self.add_bytes(f"u{code:04x}{code:04X}".encode())

    def add_pattern(self, regex: str) -> None:
        try:
            for atom in atoms(regex):
                self.add_text(atom)
        except Unread:
            self.every_byte = True

    def add_text(self, characters: Ranges) -> None:
        """Characters a JSON string writes: as UTF-8 byte ranges, or JSON's escapes."""
        self.masks |= _utf8_masks(tuple(_without(characters)))
        self.masks |= _escape_masks(
            frozenset(c for lo, hi in characters if lo < 0x80 for c in range(lo, min(hi, 0x7F) + 1))
        )

    def add_node(self, node: dict, regexes: list[str], opened: bool) -> None:
        """The lexemes ``node`` (a subschema) adds: its names, values, patterns, the JSON its types
        write (``opened``: an object open to other properties, whose values may be any)."""
        names = node.get("properties"), node.get("required")
        for literal in [*(n for group in names if isinstance(group, (dict, list)) for n in group), *_values(node)]:
            self.add_literal(literal)
        for regex in regexes:
            self.add_pattern(regex)
        kinds = node.get("type", [] if {"enum", "const", "$ref", "anyOf", "oneOf", "allOf"} & node.keys() else _KINDS)
        kinds = set(kinds if isinstance(kinds, list) else [kinds])
        formatted = _FORMAT_CLASSES.get(node["format"]) if isinstance(node.get("format"), str) else None
        if formatted is not None:
            self.add_pattern(formatted)
        written = formatted is not None or {"pattern", "enum", "const"} & node.keys()  # (else any string)
        if "string" in kinds and (not written or _any_within(node, formatted is not None)):
            self.add_any_string()
        if kinds & {"number", "integer"}:
            bounded = bool({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"} & node.keys())
            self.add_number("number" not in kinds, bounded)
        if opened or "array" in kinds:
            self.add_bytes(b"[]")
        if opened:  # (any value: an open object's, an array's of any items)
            self.add_any_string()
            self.add_number(integer=False, bounded=False)
        if opened and {"properties", "patternProperties", "required"} & node.keys():  # (names it writes not)
            self.add_other_keys()
        for literal in [True, False, None] if opened or kinds & {"boolean", "null"} else []:
            self.add_literal(literal)

    def add_any_string(self) -> None:
        """A string of any characters (a string schema's, an open object's values)."""
        self.add_text(ANY)

    def add_other_keys(self) -> None:
        """An open object's other keys: a JSON string but its names, escapes in full (``\\uD83D\\uDE00``)."""
        self.add_bytes(b"u")
        self.masks.update(map(_mask, ["0123456789ABCEFabcef", "Dd", "89ABab", "CDEFcdef", string.hexdigits]))

    def add_number(self, integer: bool, bounded: bool) -> None:
        """A number's JSON text (``bounded``: by a minimum, maximum or multiple: each digit told apart)."""
        self.add_bytes(b"-0" if integer else b"-0.")
        self.masks.update(map(_mask, ["123456789", string.digits] + ([] if integer else ["Ee", "+-"])))
        if bounded:
            self.add_bytes(string.digits.encode() + (b"" if integer else b".eE+"))


@functools.lru_cache(maxsize=4096)
def _utf8_masks(characters: tuple[tuple[int, int], ...]) -> frozenset[int]:
    """The byte sets of ``characters``' UTF-8 sequences, each sequence's last bytes of the same lead
    bytes in one (derivre's trie: ``C4 [80;83;86]``)."""
    lasts: dict[tuple, int] = {}
    for sequence in _utf8_sequences(list(characters)):
        lead, (lo, hi) = tuple(sequence[:-1]), sequence[-1]
        lasts[lead] = lasts.get(lead, 0) | _range_mask(lo, hi)
    return frozenset([*(_range_mask(lo, hi) for lead in lasts for lo, hi in lead), *lasts.values()])


@functools.lru_cache(maxsize=256)
def _escape_masks(ascii_characters: frozenset[int]) -> frozenset[int]:
    """The byte sets of JSON's escapes of the ASCII characters it escapes (``\\"``, ``\\n``, ``\\u001f``)."""
    shorts = {_SHORT_ESCAPES[c] for c in ascii_characters if c in _SHORT_ESCAPES}
    lows = [{c & 0xF for c in ascii_characters if c >> 4 == high and c < 0x20} for high in (0, 1)]
    masks = {_mask("\\"), _mask("".join(shorts))} if shorts or any(lows) or 0x7F in ascii_characters else set()
    if any(lows):  # (\u00XY: X 0 or 1, Y of the characters escaped)
        highs = ["01"] if lows[0] == lows[1] else [str(high) for high in (0, 1) if lows[high]]
        masks |= {*map(_mask, ["u", "0", *highs]), *(_hex_mask(low) for low in lows if low)}
    if 0x7F in ascii_characters:  # (\u007F)
        masks |= set(map(_mask, ["u", "0", "7", "Ff"]))
    return frozenset(masks - {0})


def _any_within(node: dict, formatted: bool) -> bool:
    """Whether llguidance writes ``node``'s pattern (``formatted``: or its format's) within a string
    of any characters: a pattern not anchored at both ends (``ab``: ``.*ab.*``), or either beside a
    length (``.{3,9}``, intersected)."""
    pattern = node.get("pattern")
    lengths = bool({"minLength", "maxLength"} & node.keys())
    if isinstance(pattern, str):
        return not _ANCHORED.fullmatch(pattern) or lengths
    return formatted and lengths


def _values(node: dict) -> list:
    """``node``'s enum and const values."""
    values = node.get("enum") if isinstance(node.get("enum"), list) else []
    return values + ([node["const"]] if "const" in node else [])


def _without(ranges: Ranges) -> Ranges:
    """``ranges`` but for what a JSON string escapes (``"``, ``\\``, control characters, DEL)."""
    return complement(complement(ranges) + [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)])


def _utf8_sequences(ranges: Ranges) -> list[list[tuple[int, int]]]:
    """``ranges``' UTF-8 encodings as sequences of byte ranges (as Rust's regex-syntax splits them)."""
    sequences, todo = [], [r for r in sorted(ranges, reverse=True)]
    while todo:
        lo, hi = todo.pop()
        if lo <= _SURROGATES[1] and hi >= _SURROGATES[0]:  # (no UTF-8 for a surrogate)
            todo += [r for r in ((_SURROGATES[1] + 1, hi), (lo, _SURROGATES[0] - 1)) if r[0] <= r[1]]
            continue
        if split := next((top for top in (0x7F, 0x7FF, 0xFFFF) if lo <= top < hi), None):
            todo += [(split + 1, hi), (lo, split)]
            continue
        for tail in (0x3F, 0xFFF, 0x3FFFF):  # (the bits its continuation bytes hold: 1, 2, 3 of them)
            if lo & ~tail != hi & ~tail:
                if lo & tail:
                    todo += [((lo | tail) + 1, hi), (lo, lo | tail)]
                    break
                if hi & tail != tail:
                    todo += [(hi & ~tail, hi), (lo, (hi & ~tail) - 1)]
                    break
        else:
            sequences.append(list(zip(chr(lo).encode(), chr(hi).encode(), strict=True)))
    return sequences


def _mask(characters: str) -> int:
    return sum(1 << ord(c) for c in set(characters))


def _range_mask(lo: int, hi: int) -> int:
    return (1 << (hi + 1)) - (1 << lo)


def _hex_mask(values: set[int]) -> int:
    return _mask("".join(f"{v:x}{v:X}" for v in values))
