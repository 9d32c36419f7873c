"""The task messages the gateway and the stages push themselves are the ones Celery's send_task
writes; prefill's goes out in the transaction that marks its handoff."""

from __future__ import annotations

import base64
import json

import redis
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from pydantic import BaseModel

from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.queue import TASKS, TaskMessages, composer, make_celery
from dayzero.serving.scripts import Take
from dayzero.settings import Settings


def _shape(value):
    """The message's structure: keys and value types, ids and payloads aside."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return type(value).__name__


def test_a_task_message_is_what_send_task_writes(redis_url):
    app = make_celery(Settings(redis_url=redis_url))
    client = redis.Redis.from_url(redis_url)
    client.delete("prefill")
    app.send_task(TASKS["prefill"], args=['{"job": 1}'])
    sent = json.loads(client.rpop("prefill"))
    ours = json.loads(TaskMessages(app, "prefill")('{"job": 1}', {"traceparent": "00-ab-cd-01"}))
    assert ours["headers"].pop("traceparent") == "00-ab-cd-01"
    for message in (sent, ours):
        message["headers"].pop("ignore_result")  # None from send_task, False here: both mean keep none
        message["properties"].pop("reply_to")
    assert _shape(ours) == _shape(sent)
    assert ours["headers"]["task"] == "dayzero.prefill" and ours["properties"]["delivery_info"] == {
        "exchange": "",
        "routing_key": "prefill",
    }
    assert json.loads(base64.b64decode(ours["body"]))[:2] == json.loads(base64.b64decode(sent["body"]))[:2]
    app.close()


def test_each_message_is_the_one_celery_builds_for_its_own_id_and_payload(redis_url):
    """Messages made from the one Celery built: each with an id of its own (in every field that
    carries it), and otherwise what ``as_task_v2`` builds for that id and payload."""
    app = make_celery(Settings(redis_url=redis_url))
    messages = TaskMessages(app, "decode")
    sent = [json.loads(messages(payload, {"traceparent": "t"})) for payload in ('{"a": 1}', '{"b": "\\u00e9"}')]
    ids = [message["headers"]["id"] for message in sent]
    tags = [message["properties"]["delivery_tag"] for message in sent]
    assert len(set(ids)) == len(set(tags)) == 2
    for message, payload in zip(sent, ('{"a": 1}', '{"b": "\\u00e9"}'), strict=True):
        task_id = message["headers"]["id"]
        built = app.amqp.as_task_v2(task_id, TASKS["decode"], args=[payload], argsrepr=f"<{len(payload)} bytes>")
        assert message["headers"] == {**built.headers, "traceparent": "t"}
        assert message["properties"]["correlation_id"] == task_id == message["headers"]["root_id"]
        assert {k: message["properties"][k] for k in built.properties} == built.properties
        assert json.loads(base64.b64decode(message["body"])) == json.loads(json.dumps(built.body))
    app.close()


class _Job(BaseModel):
    n: int


def test_a_composed_message_is_the_job_where_send_task_would_put_it_with_the_current_trace(redis_url):
    app = make_celery(Settings(redis_url=redis_url))
    client = redis.Redis.from_url(redis_url)
    client.delete("decode")
    app.send_task(TASKS["decode"], args=["x"])
    assert client.llen("decode") == 1  # where Celery's own producer puts a decode task
    client.delete("decode")
    context = SpanContext(trace_id=0xAB, span_id=0xCD, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        client.lpush("decode", composer(app, "decode")(_Job(n=7)))
    message = json.loads(client.rpop("decode"))
    assert message["headers"]["task"] == "dayzero.decode"
    assert message["headers"]["traceparent"] == f"00-{0xAB:032x}-{0xCD:016x}-01"
    assert json.loads(base64.b64decode(message["body"]))[0] == ['{"n":7}']
    app.close()


def test_a_handoff_queues_decodes_job_with_its_marks(redis_url):
    """The marks and decode's job in one atomic step: a worker that dies or loses Redis midway
    leaves both or neither (a handoff mark without its job would hold the request until it lapsed)."""
    client, app = redis.Redis.from_url(redis_url), make_celery(Settings(redis_url=redis_url))
    store = Lifecycle(client)
    client.delete("decode", key("pushed", "decode"))
    message = composer(app, "decode")(_Job(n=3))
    assert store.take("handed", 0, "prefill0", 30) == Take.CLAIMED
    assert store.hand_off("handed", 0, "prefill0", 60, "decode", message)
    assert client.get(key("handoff", "handed")) == b"decode:1" and store.owner("handed") == HANDOFF_OWNER
    assert 50_000 < client.pttl(key("lease", "handed")) <= 60_000
    assert client.rpop("decode") == message.encode() and client.llen("decode") == 0
    app.close()
