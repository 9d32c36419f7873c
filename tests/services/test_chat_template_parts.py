"""A message of several text parts, on a checkpoint that ships a Jinja chat template: transformers'
``apply_chat_template`` hands the template the parts as sent, so a template that loops over a
message's content joins them its own way, and dayzero's prompt must be transformers' for the same
messages. A template that prints the content as a string would print a list's Python repr there;
vLLM joins the text parts by a newline for it ("string" content format), and so does dayzero: the
parts were joined with nothing ("Hello" and "world" read "Helloworld"). Checked through /tokenize
(the gateway in-process, no workers), against transformers on a template this test writes."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

END = "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
AS_A_STRING = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}" + END
LOOP = "{% macro parts(c) %}{% for p in c %}<{{ p['text'] }}>{% endfor %}{% endmacro %}{% for m in messages %}"
# the parts, each its own way to the content (Qwen2-VL's template loops as the first does)
OVER_THE_PARTS = {
    "indexed": "{% for m in messages %}[{{ m['role'] }}]{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}",
    "attribute": "{% for m in messages %}[{{ m.role }}]{% for p in m.content %}{{ p.text }}{% endfor %}",
    "set": "{% for m in messages %}{% set c = m['content'] %}[{{ m['role'] }}]{% for p in c %}{{ p['text'] }}|"
    "{% endfor %}",
    "string or parts": (
        "{% for m in messages %}[{{ m['role'] }}]{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for p in m['content'] %}{{ p['text'] }} {% endfor %}{% endif %}"
    ),
    # through a macro, a with, a slice, a .get, a filter taking items: each was given one string, and a
    # loop over it iterated its characters (the words lost) or printed it joined by a newline
    "macro": LOOP + "[{{ m['role'] }}]{{ parts(m['content']) }}",
    "macro keyword": LOOP + "[{{ m['role'] }}]{{ parts(c=m.content) }}",
    # GLM-4.5's: a macro given the content, printing a string, looping over parts
    "string or parts in a macro": (
        "{% macro visible(c) %}{% if c is string %}{{ c }}{% else %}{% for p in c %}{{ p.text }}{% endfor %}"
        "{% endif %}{% endmacro %}{% for m in messages %}[{{ m.role }}]{{ visible(m.content) }}"
    ),
    # Kimi-K2's: a macro given the message, reading msg.get('content')
    "macro over the message": (
        "{% macro content_of(msg) %}{% set c = msg.get('content') %}{% if c is string %}{{ c }}{% else %}"
        "{% for p in c %}{{ p['text'] }}{% endfor %}{% endif %}{% endmacro %}"
        "{% for m in messages %}[{{ m['role'] }}]{{ content_of(m) }}"
    ),
    "with": "{% for m in messages %}[{{ m['role'] }}]{% with c = m['content'] %}{% for p in c %}{{ p['text'] }}/"
    "{% endfor %}{% endwith %}",
    "namespace": "{% set ns = namespace(c=none) %}{% for m in messages %}{% set ns.c = m['content'] %}"
    "[{{ m['role'] }}]{% for p in ns.c %}<{{ p['text'] }}>{% endfor %}",
    "slice": "{% for m in messages %}[{{ m['role'] }}]{% for p in m['content'][:8] %}<{{ p['text'] }}>{% endfor %}",
    "mapped": "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | map(attribute='text') | join('|') }}",
    # reading the parts with no loop, or through a conditional: each was given one string (its first part's
    # text read as its first character's, empty; the loop over "[]" an empty one)
    "first part": (
        "{% for m in messages %}[{{ m['role'] }}]{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{{ m['content'][0]['text'] }}{% endif %}"
    ),
    "conditional set": "{% for m in messages %}{% set c = m['content'] if m['content'] is not none else [] %}"
    "[{{ m['role'] }}]{% for p in c %}<{{ p['text'] }}>{% endfor %}",
}
PARTS = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
CHAT = [
    {"role": "system", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
    {"role": "user", "content": PARTS},
    {"role": "assistant", "content": [{"type": "text", "text": "Hi"}, {"type": "refusal", "refusal": "no"}]},
    {"role": "user", "content": "one string"},
]


def _templated(demo_dir, tmp_path, template: str):
    copy = shutil.copytree(demo_dir, tmp_path / "templated")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return copy


def _tokenized(checkpoint, redis_url, messages: list[dict], **body) -> list[int]:
    with TestClient(make_app(Settings(checkpoint=checkpoint, redis_url=redis_url))) as gateway:
        r = gateway.post("/tokenize", json={"model": MODEL, "messages": messages, **body})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def _transformers(checkpoint, messages: list[dict], **kwargs) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **kwargs))


@pytest.mark.parametrize("form", list(OVER_THE_PARTS))
def test_a_template_over_the_parts_gets_them_as_transformers_gives_them(demo_dir, redis_url, tmp_path, form):
    checkpoint = _templated(demo_dir, tmp_path, OVER_THE_PARTS[form] + END)
    # OpenAI's refusal part is an assistant's text in the history (vLLM's rendering)
    as_text = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "no"}]
    reference = [*CHAT[:2], {**CHAT[2], "content": as_text}, CHAT[3]]
    assert _tokenized(checkpoint, redis_url, CHAT) == _transformers(checkpoint, reference)


# Mistral's way: a string added to the content (a list there raises)
CONCATENATING = "{% for m in messages %}{{ '[' + m['role'] + ']' + m['content'] }}" + END


@pytest.mark.parametrize("template", [AS_A_STRING, CONCATENATING], ids=["printed", "concatenated"])
def test_a_template_taking_a_string_gets_the_parts_joined_by_a_newline(demo_dir, redis_url, tmp_path, template):
    checkpoint = _templated(demo_dir, tmp_path, template)
    texts = ["Be\nbrief.", "Hello\nworld", "Hi\nno", "one string"]
    joined = [{**m, "content": text} for m, text in zip(CHAT, texts, strict=True)]
    assert _tokenized(checkpoint, redis_url, CHAT) == _transformers(checkpoint, joined)


def test_a_template_printing_one_role_as_a_string_gets_that_role_joined(demo_dir, redis_url, tmp_path):
    # Llama-2's way: the system's content printed as a string, the other roles' looped over
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}<<{{ m['content'] }}>>{% else %}[{{ m['role'] }}]"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}<{{ p['text'] }}>"
        "{% endfor %}{% endif %}{% endif %}" + END
    )
    checkpoint = _templated(demo_dir, tmp_path, template)
    as_text = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "no"}]
    reference = [{**CHAT[0], "content": "Be\nbrief."}, CHAT[1], {**CHAT[2], "content": as_text}, CHAT[3]]
    assert _tokenized(checkpoint, redis_url, CHAT) == _transformers(checkpoint, reference)


def test_a_template_printing_a_content_as_a_string_when_there_are_tools_gets_it_joined(demo_dir, redis_url, tmp_path):
    # Llama-3.2-Vision's way: with tools, the first user's content goes into the tools block through |trim (a
    # string); without, it is looped over. Probed without tools, it was given the parts: their Python repr printed
    template = (
        "{% if tools %}{% set first = messages[0]['content'] | trim %}{% set messages = messages[1:] %}[user]"
        "{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{{ first }}{% endif %}"
        "{% for m in messages %}[{{ m['role'] }}]{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endif %}" + END
    )
    checkpoint = _templated(demo_dir, tmp_path, template)
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": PARTS}]
    joined = [{"role": "user", "content": "Hello\nworld"}]
    assert _tokenized(checkpoint, redis_url, chat, tools=tools) == _transformers(checkpoint, joined, tools=tools)
    assert _tokenized(checkpoint, redis_url, chat) == _transformers(checkpoint, chat)  # no tools: the parts
