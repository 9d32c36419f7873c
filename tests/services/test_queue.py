"""The task messages the gateway pushes itself are the ones Celery's send_task writes."""

from __future__ import annotations

import base64
import json

import redis

from dayzero.serving.queue import TASKS, make_celery, task_message
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
    ours = json.loads(task_message(app, "prefill", '{"job": 1}', {"traceparent": "00-ab-cd-01"}))
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
