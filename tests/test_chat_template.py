"""A checkpoint that ships a Jinja chat template is prompted through it, exactly as transformers'
``apply_chat_template`` renders it; one without (as DeepSeek-V4 is released) gets V4's encoding."""

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
# a template of this test's own (the demo checkpoint, like the release, ships none)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("chat") / "demo")


@pytest.fixture
def templated(demo, tmp_path):
    copy = shutil.copytree(demo, tmp_path / "templated")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return copy


def _reference(path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return list(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_the_demo_checkpoint_ships_no_template(demo):
    assert TextCodec.from_checkpoint(demo).chat_template is None
    assert "chat_template" not in json.loads((demo / "tokenizer_config.json").read_text())
    assert not (demo / "chat_template.jinja").exists()


def test_a_shipped_template_gives_transformers_ids(templated):
    ids = TextCodec.from_checkpoint(templated).chat_ids(CHAT)
    assert ids == _reference(templated)
    assert ids.count(0) == 1  # one BOS: the template's, none added by encoding


def test_a_prefix_is_continued_through_a_template(templated):
    """The last assistant message with prefix: true, as transformers' continue_final_message renders it."""
    from transformers import AutoTokenizer

    chat = [*CHAT, {"role": "assistant", "content": "It is", "prefix": True}]
    reference = AutoTokenizer.from_pretrained(str(templated)).apply_chat_template(
        chat, continue_final_message=True, tokenize=True, return_dict=False
    )
    codec = TextCodec.from_checkpoint(templated)
    assert codec.chat_ids(chat) == list(reference)
    assert codec.decode_all(reference).endswith("[user]over the lazy dog?[assistant]It is")


@pytest.mark.parametrize("form", ["named list", "jinja file"])
def test_other_places_a_template_is_published(templated, tmp_path, form):
    copy = shutil.copytree(templated, tmp_path / "copy")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    if form == "named list":
        tool_use = {"name": "tool_use", "template": "{{ 'wrong' }}"}
        config["chat_template"] = [tool_use, {"name": "default", "template": TEMPLATE}]
    else:
        del config["chat_template"]
        (copy / "chat_template.jinja").write_text(TEMPLATE)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert TextCodec.from_checkpoint(copy).chat_ids(CHAT) == TextCodec.from_checkpoint(templated).chat_ids(CHAT)


def test_without_a_template_deepseek_v4s_encoding(demo):
    codec = TextCodec.from_checkpoint(demo)
    text = (
        "<｜begin▁of▁sentence｜>Be brief.<｜User｜>The quick brown fox<｜Assistant｜></think>jumps"
        "<｜end▁of▁sentence｜><｜User｜>over the lazy dog?<｜Assistant｜></think>"
    )
    assert codec.chat_prompt(CHAT) == text
    ids = codec.chat_ids(CHAT)
    # V4's special tokens are single tokens (ids 0..9 in the demo tokenizer), not spelled out
    assert ids[0] == 0 and ids.count(0) == 1 and ids[-2:] == [4, 6] and ids.count(3) == 2 and 1 in ids
