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


def _is_content(node: nodes.Node, aliases: set[str]) -> bool:
    """``x['content']``, ``x.content``, a name set to either, or any of them through a filter."""
    while isinstance(node, nodes.Filter) and node.node is not None:
        node = node.node
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == CONTENT
    if isinstance(node, nodes.Getattr):
        return node.attr == CONTENT
    return isinstance(node, nodes.Name) and node.name in aliases


@functools.cache
def reads_content_parts(template: str) -> bool:
    """Whether ``template`` loops over a message's content (``{% for part in message['content'] %}``,
    directly or through ``{% set c = message.content %}``): then it takes a list of parts."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    # parsed by transformers' own environment: its extensions ({% generation %}, loop controls) parse
    root = _compile_jinja_template(template).environment.parse(template)
    aliases: set[str] = set()
    for assign in root.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name) and _is_content(assign.node, aliases):
            aliases.add(assign.target.name)
    return any(_is_content(loop.iter, aliases) for loop in root.find_all(nodes.For))


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
