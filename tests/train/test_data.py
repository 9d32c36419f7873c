import pytest

from dayzero.chat.encoding import encode_chat
from dayzero.chat.tokens import BOS, EOS, SPECIAL_TOKENS
from dayzero.train.corpus import split
from dayzero.train.data import documents, random_batch, token_stream, train_tokenizer, windows


@pytest.fixture(scope="module")
def corpus():
    return split(0)


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer(corpus.train[:40], 600)


def test_tokenizer_round_trips_text(tok, corpus):
    text = corpus.held_out[0].text
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_tokenizer_carries_v4_special_tokens_first(tok):
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert tok.encode("x").ids[0] == 0  # BOS prepended
    prompt = encode_chat([{"role": "user", "content": "The if statement"}])
    ids = tok.encode(prompt, add_special_tokens=False).ids
    assert ids[:2] == [0, SPECIAL_TOKENS.index("<｜User｜>")]
    assert ids[-2:] == [SPECIAL_TOKENS.index("<｜Assistant｜>"), SPECIAL_TOKENS.index("</think>")]


def test_documents_and_windows(tok, corpus):
    docs = documents(corpus.train[:5])
    assert all(d.startswith(BOS) and d.endswith(EOS) for d in docs)
    assert len(documents(corpus.train[:5], chats=False)) == 5 < len(docs)
    stream = token_stream(tok, docs)
    assert windows(stream, 64).shape == (stream.numel() // 64, 64)
    import torch

    batch = random_batch(stream, 3, 16, torch.Generator().manual_seed(0))
    assert batch.shape == (3, 16)
