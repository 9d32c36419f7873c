"""A message's content parts as a Jinja chat template takes them.

transformers' ``apply_chat_template`` hands a template the content as sent: a template that reads a
message's ``content`` as OpenAI's parts (``[{"type": "text", "text": ...}]``: a loop over them, a
``map``, ``content[0].text``) joins them its own way; one that prints ``content`` as a string prints a
list's Python repr. So, as vLLM's "auto" content format does: a template that reads the parts gets
them (the prompt is transformers' for the same messages), any other gets the parts' texts joined by
a newline ("Hello" and "world" -> "Hello\\nworld", vLLM's "string" format). An image is its
placeholder tag, as text.

Which a template reads is seen by rendering it, once per template and role: a chat whose message of
that role holds two text parts of marker texts no template prints by chance. Their texts in the
prompt: the template read the parts (a list's repr or JSON escapes the markers' NULs, so neither
shows them); absent, or the template raising on parts: it takes a string. So a template looping over
a user's parts but printing a system's content as a string gets the parts for the user only. A chat
offering tools is probed with a tool (Llama-3.2-Vision's template prints the first user's content as a
string into its tools block, and loops over it when there are none).
"""

from __future__ import annotations

import functools

CONTENT = "content"
PART_SEPARATOR = "\n"  # vLLM's, between the text parts of a message given to a template taking strings

# NULs: a repr prints them as "\\x00", JSON as "\\u0000"; no letters: an upper or lower filter keeps them
PROBE_TEXTS = ("\x00#1\x00", "\x00#2\x00")
PROBE_ASK = {"role": "user", "content": "?"}
OPENING_ROLES = ("system", "developer")  # a probe puts them first, as templates expect them
# a tool of every field a template may read (one looping over its parameters' properties too)
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe",
        "description": "",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


def _probe_chat(role: str) -> list[dict]:
    """A chat a template accepts (roles alternating, a system first) with ``role``'s message as parts."""
    probed = {"role": role, CONTENT: [{"type": "text", "text": t} for t in PROBE_TEXTS]}
    if role == "user":
        return [probed]
    if role in OPENING_ROLES:
        return [probed, PROBE_ASK]
    return [PROBE_ASK, probed, PROBE_ASK]


@functools.cache
def reads_content_parts(template: str, role: str, tokens: tuple[tuple[str, str], ...], tools: bool) -> bool:
    """Whether ``template`` prints the texts of a ``role`` message's parts given as OpenAI's parts
    (``tokens``: the special-token strings it is rendered with, ``bos_token``...; ``tools``: in a chat
    offering tools)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        (prompt,), _ = render_jinja_template(
            conversations=[_probe_chat(role)],
            tools=[PROBE_TOOL] if tools else None,
            chat_template=template,
            add_generation_prompt=True,
            **dict(tokens),
        )
    except Exception:  # any error of the template's own code on parts (a str + list...): it takes a string
        return False
    return any(text in prompt for text in PROBE_TEXTS)


def for_template(messages: list[dict], template: str, tokens: dict[str, str], tools: bool) -> list[dict]:
    """``messages`` (a list content: its part strings) as ``template`` takes them (in a chat offering
    ``tools`` or not): OpenAI's text parts for a role whose parts it reads, else one string of the
    parts joined by ``PART_SEPARATOR``."""
    rendered_with = tuple(sorted(tokens.items()))
    shaped = []
    for m in messages:
        texts = m.get(CONTENT)
        if isinstance(texts, list):
            parts = reads_content_parts(template, m["role"], rendered_with, tools)
            content = [{"type": "text", "text": t} for t in texts] if parts else PART_SEPARATOR.join(texts)
            m = {**m, CONTENT: content}
        shaped.append(m)
    return shaped
