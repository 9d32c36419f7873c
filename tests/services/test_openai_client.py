"""The gateway as the official openai client reads it: its typed models validate what the gateway
answers (strictly, as pydantic validates, not as the client's lenient construction), and a refusal
names the field the client sent. In-process gateway on a real Redis; nothing here reaches a worker."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types import Model

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, max_context=4096, max_tokens_limit=2048)
    with TestClient(make_app(settings)) as http:  # an httpx.Client: the openai client sends through it
        yield openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="k", http_client=http, max_retries=0)


def test_the_model_cards_are_openai_models(client):
    listed = client.models.list().data
    card = client.models.retrieve(MODEL)
    for model in (*listed, card):
        assert Model.model_validate(model.model_dump()) == model  # `created` is a required integer
    assert [m.id for m in listed] == [MODEL] and card == listed[0]
    assert card.created > 1_700_000_000 and card.object == "model"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_token_limit_too_large_is_refused_naming_the_field_sent(client, field):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HI, **{field: 2049})
    assert refused.value.param == field and refused.value.message.endswith(f"{field} 2049 exceeds the limit 2048")

    long = [{"role": "user", "content": "word " * 1500}]  # 3004 tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=long, **{field: 2000})
    assert refused.value.param == field and refused.value.code == "context_length_exceeded"
    assert f"+ {field} (2000) exceeds the context limit 4096" in refused.value.message


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_model_not_served_raises_the_clients_not_found_error(client, endpoint):
    """OpenAI (and vLLM) answer a model they do not serve 404: code written for OpenAI catches
    NotFoundError. The gateway's 400 raised BadRequestError."""
    with pytest.raises(openai.NotFoundError) as refused:
        if endpoint == "chat":
            client.chat.completions.create(model="nope", messages=HI)
        else:
            client.completions.create(model="nope", prompt="hi")
    assert (refused.value.code, refused.value.param) == ("model_not_found", "model")
