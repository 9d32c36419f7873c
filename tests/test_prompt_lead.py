"""dayzero.lead_space.prompt_lead through a completion's text: a sentencepiece decoder drops a
text's lead space, so a completion decoded alone lost the space of its first word ("Hello" then
"▁world" streamed "world"). Its text now reads as it does after the prompt: transformers' decode
of prompt and completion together, past the prompt's text (vLLM primes its detokenizer with the
prompt's last tokens too), live, rebuilt from streamed tokens, and ended by the time limit alike."""

from __future__ import annotations

from types import SimpleNamespace

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from dayzero.completion import Completion
from dayzero.completion_text import CompletionText
from dayzero.lead_space import prompt_lead
from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.runtime import Runtime
from dayzero.serving.time_limit import past_limit
from dayzero.tokenizer import TextCodec

from .test_engine import _until_finished
from .test_lead_space import SAMPLE, llama_style

BOS, EOS = 1, (2,)
SAMPLING = SamplingParams(max_tokens=100)


def _after(reference: PreTrainedTokenizerFast, prompt: list[int], completion: list[int]) -> str:
    """The completion's text after the prompt's: transformers' decode of both, past the prompt's."""
    whole = reference.decode(prompt + completion, skip_special_tokens=True)
    return whole[len(reference.decode(prompt, skip_special_tokens=True)) :]


def _live(codec: TextCodec, prompt: list[int], completion: list[int], generated: tuple[int, ...] = ()) -> list[str]:
    """What a completion releases at each of ``completion``'s tokens after ``generated`` (a rebuilt
    one's), then at its end."""
    built = Completion(codec, SAMPLING, EOS, len(prompt), 4096, generated, prompt_ids=prompt)
    return [built.accept(token).text for token in completion] + [built.end()[0]]


def test_a_completion_reads_as_it_does_after_its_prompt_at_every_split():
    """ "Hello world  2023 中!" cut into prompt and completion at each token (a BOS first, left out
    of the text): the completion's text is transformers' decode of both past the prompt's ("
    world  2023 中!" after "Hello": it was "world  2023 中!"), and one rebuilt from its first tokens
    (another worker's) releases the rest as it does. A prompt that ends in a character cut short
    is left out: its own text ends in U+FFFD, which the whole's does not (test_prompt_cut.py)."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids = reference.encode(SAMPLE, add_special_tokens=False)
    assert "".join(_live(codec, [BOS, *ids[:1]], ids[1:])) == " world  2023 中!"  # (the reviewer's probe's split)
    for cut in range(len(ids)):
        prompt, completion = [BOS, *ids[:cut]], ids[cut:]
        if reference.decode(prompt).endswith("\ufffd"):
            continue
        live = _live(codec, prompt, completion)
        assert "".join(live) == _after(reference, prompt, completion), cut
        assert "".join(_live(codec, prompt, completion[2:], tuple(completion[:2]))) == "".join(live[2:]), cut
    assert "".join(_live(codec, [BOS], ids)) == SAMPLE  # (a prompt that shows no text: the completion begins it)


def test_the_time_limits_end_releases_what_the_live_stream_held_after_the_prompt():
    """A request ended by the time limit after each count of streamed tokens: what they streamed
    live plus the end's text (``past_limit``, replaying them after the prompt) is transformers'
    decode of prompt and tokens past the prompt's. A stop string " world!" holds " world" back, for
    the end to release it: a replay that decoded the tokens alone held nothing ("world" was out)
    and released "", and the text lacked " world"."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids = reference.encode(SAMPLE, add_special_tokens=False)
    prompt = [BOS, *ids[:1]]
    sampling = SamplingParams(max_tokens=100, stop=(" world!",))
    request = GenerationRequest(request_id="w", prompt_ids=tuple(prompt), sampling=sampling, created=0.0)
    for count in range(2, len(ids) + 1):
        streamed = ids[1:count]
        live = Completion(codec, sampling, EOS, len(prompt), 4096, prompt_ids=prompt)
        text, _ = _until_finished(live, streamed)
        assert text + past_limit(codec, request, streamed, 1.0).text == _after(reference, prompt, streamed), count


def test_a_metaspace_completion_keeps_its_space_after_the_prompt():
    """Metaspace (older sentencepiece conversions) drops the first token's prefix space as Strip does."""
    tokenizer = Tokenizer(models.BPE({"<s>": 0, "▁a": 1, "▁b": 2, "</s>": 3}, []))
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.decoder = decoders.Metaspace()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    text = CompletionText(codec, SAMPLING, False, [0, 1])
    assert "".join(text.push(t)[0] for t in (2, 1)) + text.end()[0] == _after(reference, [0, 1], [2, 1]) == " b a"


def test_a_byte_level_decoder_decodes_a_completion_alone_as_before(codec, monkeypatch):
    """DeepSeek's byte-level decoder drops no lead space: no prompt id is decoded with the
    completion (the same decodes, the same text, as without the prompt)."""
    prompt, completion = codec.encode("Hello"), codec.encode(" world, again", special=False)
    assert prompt_lead(codec, prompt) == ([], 0)
    decodes = []
    monkeypatch.setattr(codec, "decode", lambda ids, decode=codec.decode: decodes.append(list(ids)) or decode(ids))
    texts = []
    for given in ((), prompt):
        text = CompletionText(codec, SAMPLING, False, given)
        texts.append("".join(text.push(t)[0] for t in completion) + text.end()[0])
    assert texts == [" world, again"] * 2
    assert decodes[: len(decodes) // 2] == decodes[len(decodes) // 2 :]


def test_the_decode_services_completion_follows_its_requests_prompt():
    """``Runtime.completion``, the decode loop's (and a re-run's) completion of a request, is given
    the request's prompt: its "▁world" after "Hello" releases " world"."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    ids = reference.encode("Hello world", add_special_tokens=False)
    request = GenerationRequest(request_id="r", prompt_ids=(BOS, ids[0]), sampling=SAMPLING, created=0.0)
    runtime = SimpleNamespace(codec=codec, model=SimpleNamespace(cfg=SimpleNamespace(eos_token_ids=EOS)))
    ticket = SimpleNamespace(job=SimpleNamespace(request=request), grammar=None)
    assert Runtime.completion(runtime, ticket, (), 4096).accept(ids[1]).text == " world"


def test_an_id_the_tokenizer_lacks_shows_no_text_before_the_completion():
    """A model's vocabulary padded past its tokenizer's (Phi-3's 32,064 rows over 32,011 tokens):
    the gateway takes prompt ids up to the model's, and such an id decodes to nothing. A prompt
    "Hello" then one was decoded after that id alone, so "▁world" lost its space ("world"; was
    " world" in transformers' decode of both, past the prompt's); a prompt of BOS and one shows
    no text, and the completion begins it."""
    tokenizer = llama_style()
    reference, codec = PreTrainedTokenizerFast(tokenizer_object=tokenizer), TextCodec(tokenizer)
    padded = tokenizer.get_vocab_size() + 5  # (no token of the tokenizer's)
    hello, world = reference.encode("Hello world", add_special_tokens=False)
    for prompt in ([BOS, hello, padded], [BOS, hello, padded, padded], [BOS, padded]):
        assert "".join(_live(codec, prompt, [world, padded, world])) == _after(reference, prompt, [world, world])
    assert _after(reference, [BOS, hello, padded], [world]) == " world"
    assert prompt_lead(codec, [BOS, padded]) == ([], 0)
