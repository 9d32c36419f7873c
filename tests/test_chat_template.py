"""Chats become prompt ids through the checkpoint's chat template exactly as transformers'
``apply_chat_template`` makes them; without a template, through the built-in format."""

from __future__ import annotations

import json
import shutil

import pytest

from dayzero.demo import write_demo_checkpoint
from dayzero.tokenizer import TextCodec

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "The quick brown fox"},
    {"role": "assistant", "content": "jumps"},
    {"role": "user", "content": "over the lazy dog?"},
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("chat") / "demo")


def _reference(path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return list(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_the_checkpoints_template_gives_transformers_ids(demo):
    ids = TextCodec.from_checkpoint(demo).chat_ids(CHAT)
    assert ids == _reference(demo)
    assert ids.count(0) == 1  # one BOS: the template's, none added by encoding


@pytest.mark.parametrize("form", ["named list", "jinja file"])
def test_other_places_a_template_is_published(demo, tmp_path, form):
    copy = shutil.copytree(demo, tmp_path / "copy")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    if form == "named list":
        tool_use = {"name": "tool_use", "template": "{{ 'wrong' }}"}
        config["chat_template"] = [tool_use, {"name": "default", "template": template}]
    else:
        del config["chat_template"]
        (copy / "chat_template.jinja").write_text(template)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert TextCodec.from_checkpoint(copy).chat_ids(CHAT) == TextCodec.from_checkpoint(demo).chat_ids(CHAT)


def test_without_a_template_the_built_in_format(demo, tmp_path):
    copy = shutil.copytree(demo, tmp_path / "plain")
    (copy / "tokenizer_config.json").unlink()
    codec = TextCodec.from_checkpoint(copy)
    text = "<|system|>Be brief.\n<|user|>The quick brown fox\n<|assistant|>jumps\n<|user|>over the lazy dog?\n"
    assert codec.chat_template is None and codec.chat_ids(CHAT) == codec.encode(text + "<|assistant|>")
