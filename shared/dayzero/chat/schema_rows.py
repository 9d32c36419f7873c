"""The rows of llguidance's parser a JSON schema's objects fill, counted before anything compiles
it: a row holds at most ``ROW_ITEMS`` items, which an object of some 500 optional properties fills,
or the objects of one anyOf / oneOf together (llguidance finds it only once a reply reaches them:
a 400 after its compile, or a reply that fails mid-way)."""

from __future__ import annotations

from .schema_merge import Merged, resolve

ROW_ITEMS = 2000  # llguidance's max_items_in_row (its default; chat.grammar.parser_limits passes it)
# The rows of llguidance's parser an object's optional properties (not in required) fill (measured,
# llguidance 1.x). With no required property: one row, 4 items each, plus 7 (open: any other property
# may follow) or less 1 (additionalProperties false): 498 / 500 at most. With one: the optional
# properties declared before the first required one, 3 items each plus 1 (666 at most); then those
# after each required one, 2 items each plus 1, and 2 more when some come before the first required
# one; after the last, plus 3 when open, and those before the first and 3 when there are some (998
# at most after a required one first: llguidance took the object of 1,000 after it, which the first
# steps' check let through, and failed each reply mid-way)
_OPEN_ROW, _CLOSED_ROW = 7, -1
# definitions a schema's unions' checks follow, all together: past it a union counts the objects written
# in it (llguidance's compile check backs them). Unions that interlock by hundreds of references cost the
# square of their number (a chain of 740 within the default 3,000 subschemas: 0.9 s; 23 ms of CPU so bound)
MOST_FOLLOWED = 10_000

_NOTHING: tuple[int, int, frozenset[int]] = (0, 0, frozenset())


class RowCheck:
    """The row checks of the subschemas of one schema, ``root`` (where its ``$ref``s point). What
    each subschema opens with is found once, whatever refers to it."""

    def __init__(self, root: object, merged: Merged) -> None:
        self._root, self._merged = root, merged.within(root)
        self._runs: dict[int, list[int]] = {}  # a subschema's id -> its runs
        # a subschema's id -> what opens where it does, as written in it: (the items of its objects,
        # their optional properties that may come first, the ids of the definitions its $refs point to)
        self._opens: dict[int, tuple[int, int, frozenset[int]]] = {}
        self._definitions: dict[int, dict] = {}  # a definition's id -> it
        self._followed = 0  # definitions the unions' checks walked to (at most MOST_FOLLOWED)

    def problem(self, node: dict) -> str | None:
        """Why llguidance's parser cannot take ``node`` (None: it can): an object whose optional
        properties fill a row past what it holds, or a union whose objects, opening in one row, hold
        more together (its nested unions' and those of the definitions its branches refer to too)."""
        if (row := _widest_row(node, self._runs_of(node))) is not None and row[0] > ROW_ITEMS:
            return row[1]
        if _branches(node) is None:
            return None
        if (row := self._row(node))[0] > ROW_ITEMS:
            return (
                f"the objects of one anyOf / oneOf hold {row[1]:,} optional properties that may come first (none "
                f"required, or declared before the first required one) together: llguidance's parser offers them all "
                f"in one row, {row[0]:,} items of its {ROW_ITEMS:,}"
            )
        return None

    def _runs_of(self, node: dict) -> list[int]:
        if (runs := self._runs.get(id(node))) is None:
            self._runs[id(node)] = runs = _runs(node)
        return runs

    def _row(self, node: dict) -> tuple[int, int]:
        """(items, optional properties that may come first) of the row where ``node`` opens: its
        objects, and those of each definition its ``$ref``s lead to, once (llguidance predicts a
        definition once, however many branches refer to it; an object written twice is two)."""
        items, optional, refs = self._opening(node)
        seen, todo = set(refs), list(refs)
        while todo and self._followed < MOST_FOLLOWED:
            self._followed += 1
            more_items, more_optional, more = self._opening(self._definitions[todo.pop()])
            items, optional = items + more_items, optional + more_optional
            todo.extend(more - seen)
            seen |= more
        return items, optional

    def _opening(self, node: dict) -> tuple[int, int, frozenset[int]]:
        """What opens where ``node`` opens, as llguidance merges it (``_opens``): itself, if an object;
        a union's branches', through nested unions; walked without recursion."""
        node = self._merged.merged(node)
        if (known := self._opens.get(id(node))) is not None:
            return known
        stack, walking = [(node, False)], set()
        while stack:
            subschema, done = stack.pop()
            subschema = self._merged.merged(subschema)
            key = id(subschema)
            if key in self._opens or (key in walking and not done):
                continue
            branches = _branches(subschema) if isinstance(subschema, dict) else None
            if not isinstance(subschema, dict):  # (merged into true or false)
                self._opens[key] = _NOTHING
            elif branches is None:
                self._opens[key] = self._leaf(subschema)
            elif not done:
                walking.add(key)
                stack.append((subschema, True))
                stack.extend((branch, False) for branch in branches)
            else:
                parts = [self._opens.get(id(self._merged.merged(b)), _NOTHING) for b in branches]
                refs = frozenset().union(*(part[2] for part in parts))
                self._opens[key] = sum(part[0] for part in parts), sum(part[1] for part in parts), refs
        return self._opens[id(node)]

    def _leaf(self, node: dict) -> tuple[int, int, frozenset[int]]:
        """What opens where ``node``, no union, opens: a ``$ref``'s definition (none when it points
        outside the schema), an object, or nothing."""
        if isinstance(ref := node.get("$ref"), str):
            if not isinstance(target := self._merged.merged(resolve(self._root, ref)), dict):
                return _NOTHING
            self._definitions[id(target)] = target
            return 0, 0, frozenset((id(target),))
        runs = self._runs_of(node)
        return (_opening_row(node, runs), runs[0], frozenset()) if runs else _NOTHING


def _branches(node: dict) -> list[dict] | None:
    """A union's branches (None: ``node`` is no anyOf / oneOf)."""
    lists = [node[key] for key in ("anyOf", "oneOf") if isinstance(node.get(key), list)]
    return [b for branches in lists for b in branches if isinstance(b, dict)] if lists else None


def _runs(node: object) -> list[int]:
    """The object ``node``'s optional properties in runs, as declared: [all of them] when none is
    required; else [those before the first required one, those after it up to the next, ..., those
    after the last]. Empty: not an object (a schema typed only as others has no object to enforce,
    whatever properties it names)."""
    if not isinstance(node, dict):
        return []
    kind, properties = node.get("type"), node.get("properties")
    typed = kind == "object" or isinstance(kind, list) and "object" in kind
    if not typed and (kind is not None or not isinstance(properties, dict)):
        return []
    properties = properties if isinstance(properties, dict) else {}
    required = node.get("required")
    named = {r for r in required if isinstance(r, str)} & properties.keys() if isinstance(required, list) else set()
    runs = [0]
    for name in properties:
        if name in named:
            runs.append(0)
        else:
            runs[-1] += 1
    return runs


def _opening_row(node: dict, runs: list[int]) -> int:
    """The items of llguidance's parser row where the object ``node`` (its ``runs``) opens."""
    if len(runs) == 1:  # none required (none at all: 7 items open, 1 closed)
        return max(1, 4 * runs[0] + _end_items(node))
    return 3 * runs[0] + 1 if runs else 0


def _end_items(node: dict) -> int:
    """The items a row holds besides its optional properties' where the object ``node`` may end, none
    required: 7 open to other properties, less 1 closed; 1 more for each patternProperties' name
    (measured: 450 optional and 400 patterns, 2,207 items open, 2,206 closed)."""
    closed, named = node.get("additionalProperties") is False, _pattern_names(node)
    return _OPEN_ROW - closed + named if named else _CLOSED_ROW if closed else _OPEN_ROW


def _pattern_names(node: dict) -> int:
    return len(patterns) if isinstance(patterns := node.get("patternProperties"), dict) else 0


def _widest_row(node: object, runs: list[int]) -> tuple[int, str] | None:
    """The row of llguidance's parser that the object ``node``'s optional properties (its ``runs``)
    fill most: (its items, the refusal were it past the row's). None: no optional property."""
    if not any(runs):
        return None
    closed, named = node.get("additionalProperties") is False, _pattern_names(node)
    if len(runs) == 1:
        most = (ROW_ITEMS - _end_items(node)) // 4
        kind = "with additionalProperties false" if closed else "open to other properties"
        kind += f" and {named:,} patternProperties" if named else ""
        return _opening_row(node, runs), (
            f"an object of {runs[0]:,} optional properties (not in required): at most {most} in one object "
            f"{kind} can be enforced (llguidance's parser holds {ROW_ITEMS:,} items in a row, 4 per optional property)"
        )
    rows = [(_opening_row(node, runs), runs[0], (ROW_ITEMS - 1) // 3, "declared before its first required one")]
    for i, run in enumerate(runs[1:], 1):
        if i == len(runs) - 1:  # after the last required one (and the patterns' names: 1 item each)
            end = (1 if closed else 3) + (runs[0] + 3 if runs[0] else 0) + named
        else:
            end = 1 + (2 if runs[0] else 0)
        rows.append((2 * run + end, run, (ROW_ITEMS - end) // 2, "declared after a required one"))
    items, optional, most, where = max(rows)
    return items, (
        f"an object of {optional:,} optional properties {where} in a row: at most {most} can be enforced "
        f"(llguidance's parser offers them in one row, which holds {ROW_ITEMS:,} items)"
    )
