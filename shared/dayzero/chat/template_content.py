"""A message's content parts as a Jinja chat template takes them.

transformers' ``apply_chat_template`` hands a template the content as sent: a template that loops
over a message's ``content`` reads OpenAI's parts (``[{"type": "text", "text": ...}]``) and joins
them its own way; one that prints ``content`` as a string prints a list's Python repr. So, as vLLM's
"auto" content format does: a template that loops over a ``content`` gets the parts (the prompt is
transformers' for the same messages), any other gets the parts' texts joined by a newline ("Hello"
and "world" -> "Hello\\nworld", vLLM's "string" format). An image is its placeholder tag, as text.
"""

from __future__ import annotations

import functools

from jinja2 import nodes

CONTENT = "content"
PART_SEPARATOR = "\n"  # vLLM's, between the text parts of a message given to a template taking strings


# filters that take their input item by item: over a string's characters they read nothing, so a
# content given to one (``m['content'] | map(attribute='text') | join``) is read as parts
ITEM_FILTERS = {"map", "selectattr", "rejectattr"}


def _is_content(node: nodes.Node, aliases: set[str]) -> bool:
    """``x['content']``, ``x.content``, ``x.get('content')``, a slice of one, a name bound to any
    (a set, a with, a macro's parameter, a namespace's attribute), or any of them through a filter."""
    while isinstance(node, nodes.Filter) and node.node is not None:
        node = node.node
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):  # x['content'][:n]
        return _is_content(node.node, aliases)
    if isinstance(node, nodes.Getitem):
        return _is_const_content(node.arg)
    if isinstance(node, nodes.Getattr):  # (ns.c: a namespace's attribute set to a content)
        return node.attr == CONTENT or _bound_name(node) in aliases
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr) and node.node.attr == "get":
        return bool(node.args) and _is_const_content(node.args[0])
    return _bound_name(node) in aliases


def _bound_name(node: nodes.Node) -> str | None:
    """The name a set or a read gives a value: ``c``, or ``ns.c`` for a namespace's attribute."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name):
        return f"{node.node.name}.{node.attr}"
    return None


def _is_const_content(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Const) and node.value == CONTENT


def _bindings(root: nodes.Template) -> list[tuple[nodes.Node, nodes.Node]]:
    """(target, value) of every name a template binds: its sets, withs, and each macro call's
    arguments to the macro's parameters (by place, then by keyword)."""
    bound = [(a.target, a.node) for a in root.find_all(nodes.Assign)]
    bound += [pair for w in root.find_all(nodes.With) for pair in zip(w.targets, w.values, strict=False)]
    macros = {m.name: m.args for m in root.find_all(nodes.Macro)}
    for call in root.find_all(nodes.Call):
        params = macros.get(call.node.name, []) if isinstance(call.node, nodes.Name) else []
        by_name = {p.name: p for p in params}
        bound += list(zip(params, call.args, strict=False))
        bound += [(by_name[kw.key], kw.value) for kw in call.kwargs if kw.key in by_name]
    return bound


def _content_aliases(root: nodes.Template) -> set[str]:
    """The names bound to a content, directly or through other such names (to a fixed point)."""
    bound = [(name, value) for target, value in _bindings(root) if (name := _bound_name(target)) is not None]
    aliases: set[str] = set()
    while grown := {name for name, value in bound if name not in aliases and _is_content(value, aliases)}:
        aliases |= grown
    return aliases


@functools.cache
def reads_content_parts(template: str) -> bool:
    """Whether ``template`` loops over a message's content (``{% for part in message['content'] %}``,
    directly, through ``{% set c = message.content %}`` or a macro given it) or filters it item by
    item: then it takes a list of parts."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    # parsed by transformers' own environment: its extensions ({% generation %}, loop controls) parse
    root = _compile_jinja_template(template).environment.parse(template)
    aliases = _content_aliases(root)
    if any(_is_content(loop.iter, aliases) for loop in root.find_all(nodes.For)):
        return True
    return any(f.name in ITEM_FILTERS and _is_content(f, aliases) for f in root.find_all(nodes.Filter))


def for_template(messages: list[dict], template: str) -> list[dict]:
    """``messages`` (a list content: its part strings) as ``template`` takes them: OpenAI's text
    parts if it loops over a content, else one string of the parts joined by ``PART_SEPARATOR``."""
    parts = reads_content_parts(template)
    shaped = []
    for m in messages:
        texts = m.get(CONTENT)
        if isinstance(texts, list):
            content = [{"type": "text", "text": t} for t in texts] if parts else PART_SEPARATOR.join(texts)
            m = {**m, CONTENT: content}
        shaped.append(m)
    return shaped
