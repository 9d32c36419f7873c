"""Logprobs in the completions format (in-process, no stack): its ``top_logprobs`` are keyed by the
tokens' names, so two pieces of characters (each U+FFFD as text) must not share one."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from dayzero.completion import Completion
from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token
from dayzero.settings import Settings
from dayzero.tokenizer import TextCodec
from services.gateway.app import make_app
from services.gateway.shapes import Shape


def test_pieces_of_characters_are_named_by_their_bytes_and_keep_their_own_keys(codec):
    pieces = [t for t in range(codec.vocab_size) if codec.token_piece(t)[0] == "\ufffd"]
    first, second = pieces[:2]  # e.g. one character's first byte and another's
    request = GenerationRequest(
        request_id="r", prompt_ids=(1,), sampling=SamplingParams(max_tokens=2, logprobs=3), created=time.time()
    )
    top = ((first, -0.5), (second, -1.0), (codec.encode("a")[1], -2.0))
    token = Token("r", 0, first, "", "length", logprob=-0.5, top=top)
    logprobs = Shape(request, "m", codec).body("", "length", {}, [token])["choices"][0]["logprobs"]
    names = [f"bytes:\\x{codec.token_piece(t)[1][0]:02x}" for t in (first, second)]
    assert logprobs["tokens"] == names[:1]
    assert logprobs["top_logprobs"] == [{names[0]: -0.5, names[1]: -1.0, "a": -2.0}]  # was {"\ufffd": -1.0, "a": -2.0}


def test_text_offsets_start_past_the_u_fffd_of_bytes_a_token_does_not_continue(codec):
    """A token after held bytes it does not continue (a run of lead bytes; a cut character, then
    "b"; ED then BE, outside ED's range) begins after their U+FFFD: the offsets were [0, 0, 1] and
    [0, 1, 1] ("b" at the U+FFFD). A character's bytes over several tokens keep its start."""
    from ..test_tokenizer import _byte_token

    request = GenerationRequest(
        request_id="r", prompt_ids=(1,), sampling=SamplingParams(max_tokens=9, logprobs=0), created=time.time()
    )
    b = [_byte_token(codec, x) for x in (0xE4, 0xB8, 0xAD, 0xED, 0xBE)]
    a_, b_ = codec.encode("a", special=False), codec.encode("b", special=False)
    for ids, offsets in (
        ([b[0]] * 3, [0, 1, 2]),
        (a_ + [b[0]] + b_, [0, 1, 2]),
        ([b[3], b[4]] + b_, [0, 1, 2]),
        (a_ + b[:3] + b_, [0, 1, 1, 1, 2]),
    ):
        tokens = [Token("r", i, t, "", None, logprob=-0.1) for i, t in enumerate(ids)]
        body = Shape(request, "m", codec).body(codec.decode(ids), "length", {}, tokens)["choices"][0]
        assert body["logprobs"]["text_offset"] == offsets, ids
        assert body["text"][offsets[-1] :] == codec.decode(ids[-1:])  # the last token's text, at its offset


def test_text_offsets_after_a_prompt_cut_inside_a_character_index_the_completions_text(codec):
    """ "Hi 🙂a" cut into prompt and completion at each token: where the prompt ends inside 🙂, the
    completion's text begins with it once its bytes complete it ("🙂a": lead_space.prompt_lead), and
    its bytes' offsets are its start, 0, then "a" at 1. They counted one U+FFFD a byte, as in the
    text it had before ("a" at 3 and 2, past the text's end, after 1 and 2 of its 4 bytes)."""
    ids = codec.encode("Hi 🙂a", special=False)
    sampling = SamplingParams(max_tokens=9, logprobs=0)
    for at in range(1, len(ids)):
        prompt, ids_ = ids[:at], ids[at:]
        completion = Completion(codec, sampling, (1,), at, 4096, prompt_ids=prompt)
        text = "".join(completion.accept(token).text for token in ids_) + completion.end()[0]
        request = GenerationRequest(request_id="r", prompt_ids=tuple(prompt), sampling=sampling, created=time.time())
        tokens = [Token("r", i, token, "", None, logprob=-0.1) for i, token in enumerate(ids_)]
        offsets = Shape(request, "m", codec).body(text, "length", {}, tokens)["choices"][0]["logprobs"]["text_offset"]
        assert text[offsets[-1] :] == "a" and "Hi 🙂a".endswith(text), (at, text, offsets)


def _llama_request(kind: str = "completion", prompt: tuple[int, ...] = (1,), echo: bool = False) -> GenerationRequest:
    sampling = SamplingParams(max_tokens=20, logprobs=1)
    return GenerationRequest(
        request_id="r", kind=kind, prompt_ids=prompt, sampling=sampling, created=time.time(), echo=echo
    )


def test_a_sentencepiece_completions_tokens_and_offsets_are_its_texts(tmp_path):
    """Llama's decoder strips a text's lead space, and each token was decoded alone: "▁world" was
    named "world" and the offsets ran one short per word after the first (text_offset [0, 5, 10,
    ...] in "Hello world  2023 中!"). Offsets against transformers' decode of each prefix (a token
    inside 中: 中's start), names against the returned text at them (OpenAI's and vLLM's)."""
    from transformers import PreTrainedTokenizerFast

    from ..test_lead_space import SAMPLE, llama_style

    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids = reference.encode(SAMPLE, add_special_tokens=False)
    tokens = [Token("r", i, t, "", None, logprob=-0.1, top=((t, -0.1),)) for i, t in enumerate(ids)]
    body = Shape(_llama_request(), "m", codec).body(codec.decode(ids), "length", {}, tokens)["choices"][0]
    prefixes = [reference.decode(ids[:i]) for i in range(len(ids))]
    assert body["text"] == reference.decode(ids) == SAMPLE
    assert body["logprobs"]["text_offset"] == [len(p) if "\ufffd" not in p else SAMPLE.index("中") for p in prefixes]
    names, offsets = body["logprobs"]["tokens"], body["logprobs"]["text_offset"]
    assert names[:4] == ["Hello", " world", " ", " "]  # were "Hello", "world", "", ""
    for name, top, at in zip(names, body["logprobs"]["top_logprobs"], offsets, strict=True):
        assert name.startswith("bytes:") or SAMPLE[at:].startswith(name)
        assert list(top) == [name]
    # a prompt "Hello" and its completion, echoed and not: the completion's text follows the prompt's
    # (transformers' decode of both: " world  2023 中!", as the decode service makes it), its first
    # token no longer begins the text: named " world" (was "world", and the echo "Helloworld  ...")
    completion = reference.decode(ids)[len(reference.decode(ids[:1])) :]
    tokens = [Token("r", i, t, "", None, logprob=-0.1, prompt=[] if i == 0 else None) for i, t in enumerate(ids[1:])]
    for echo, text, skipped in ((True, SAMPLE, 0), (False, completion, 1)):
        request = _llama_request(prompt=tuple(ids[:1]), echo=echo)
        body = Shape(request, "m", codec).body(completion, "length", {}, tokens)["choices"][0]
        assert body["text"] == text
        assert body["logprobs"]["tokens"] == names[skipped:]
        assert body["logprobs"]["text_offset"] == [at - len(SAMPLE) + len(text) for at in offsets[skipped:]]


def test_a_sentencepiece_chats_entries_are_its_texts_in_a_stream_and_a_resumed_one():
    """A chat's entries named "▁world" "world" too: their bytes joined to "Helloworld2023...",
    not the content's UTF-8. The first entry alone begins the text, in the stream's first chunk,
    not in a resumed stream's (the replayed tokens before it), nor after a prompt that shows text."""
    from transformers import PreTrainedTokenizerFast

    from ..test_lead_space import SAMPLE, llama_style

    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids = reference.encode(SAMPLE, add_special_tokens=False)
    tokens = [
        Token("r", i, t, reference.decode(ids[: i + 1])[len(reference.decode(ids[:i])) :], None, logprob=-0.1)
        for i, t in enumerate(ids)
    ]
    shape = Shape(_llama_request("chat"), "m", codec)
    entries = [
        e
        for c in (tokens[:2], tokens[2:])
        for e in shape.chunk("", None, tokens=c)["choices"][0]["logprobs"]["content"]
    ]
    assert [e["token"] for e in entries[:4]] == ["Hello", " world", " ", " "]  # were "Hello", "world", "", ""
    assert bytes(b for e in entries for b in e["bytes"]) == SAMPLE.encode()
    resumed = Shape(_llama_request("chat"), "m", codec)
    for token in tokens[:1]:
        resumed.replay(token)
    assert resumed.chunk("", None, tokens=tokens[1:])["choices"][0]["logprobs"]["content"] == entries[1:]
    # after a prompt that shows text (a template's "[/INST]"), the reply's first token follows it
    after = Shape(_llama_request("chat", prompt=(1, ids[0])), "m", codec).chunk("", None, tokens=tokens[1:])
    assert after["choices"][0]["logprobs"]["content"] == entries[1:]


def test_a_resumed_chats_replay_names_no_token(codec, monkeypatch):
    """A resumed chat's replayed tokens only move its split and its logprobs' opening on: each built
    its entry and its top_logprobs' (1 + top_logprobs decodes a token, 21 with 20 alternatives, on
    the gateway's event loop, for any tokenizer: DeepSeek's byte-level one has no opening) and
    dropped them. The entries after the replay are the live stream's."""
    ids = codec.encode("The quick brown fox", special=False)
    tokens = [
        Token("r", i, t, codec.decode([t]), None, logprob=-0.1, top=((t, -0.1), (1, -2.0))) for i, t in enumerate(ids)
    ]
    live = Shape(_llama_request("chat"), "m", codec).chunk("", None, tokens=tokens)["choices"][0]["logprobs"]
    resumed, named = Shape(_llama_request("chat"), "m", codec), []
    piece = codec.token_piece
    monkeypatch.setattr(codec, "token_piece", lambda token, opening=False: named.append(token) or piece(token, opening))
    for token in tokens[:2]:
        resumed.replay(token)
    assert named == []  # were 6: each replayed token and its 2 alternatives
    assert resumed.chunk("", None, tokens=tokens[2:])["choices"][0]["logprobs"]["content"] == live["content"][2:]


def test_a_completion_after_a_prompt_showing_no_text_begins_it_whatever_ids_it_holds():
    """A prompt of BOS and an id past the tokenizer's (a model's padded vocabulary: the gateway
    takes it) shows no text, so the completion's "▁world" begins the text: "world" as its text
    reads; it was named " world" at offset 0, one character past the text."""
    from transformers import PreTrainedTokenizerFast

    from ..test_lead_space import llama_style

    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids, padded = reference.encode("world world", add_special_tokens=False), tokenizer.get_vocab_size() + 5
    tokens = [Token("r", i, t, "", None, logprob=-0.1) for i, t in enumerate(ids)]
    body = Shape(_llama_request(prompt=(1, padded)), "m", codec).body("world world", "length", {}, tokens)
    logprobs = body["choices"][0]["logprobs"]
    assert reference.decode([1, padded, *ids], skip_special_tokens=True) == "world world"
    assert (logprobs["tokens"], logprobs["text_offset"]) == (["world", " world"], [0, 5])  # was " world" first


def test_the_gateway_builds_the_shown_tokens_before_it_serves(demo_dir, redis_url):
    """``TextCodec.shown``'s id set (which tokens a text shows: logprobs' bytes, a prompt's lead) is
    built as the gateway starts: built by the first logprobs request, it walked the vocabulary (~0.3 s at
    129k ids) on the event loop every stream shares."""
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as gateway:
        assert "_shown_ids" in vars(gateway.app.state.gateway.codec)
