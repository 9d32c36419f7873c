"""What admission writes: the queue a request waits in, how long its record lives, and the keys
and arguments of the ``ADMIT`` script (lifecycle.py runs it, watching.py the gateway's async twin)."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key
from .messages import GenerationRequest


@dataclass(frozen=True, slots=True)
class Queue:
    """Where admitted requests wait: the stage's broker list, a message per request (none: recorded
    only), and how many messages it may hold (more: the whole admission is refused)."""

    stage: str
    messages: tuple[str, ...] = ()
    bound: int = 2**31


def record_s(queued_s: float, stream_ttl_s: int) -> int:
    """How long an admitted request's record (its JSON, images, reader) lives: a wait in the queue
    and a generation, each bounded by ``queued_s`` (the broker's visibility timeout, above the task
    time limit: settings.visibility_timeout_s), then its stream's resumable time. ``settle``
    shortens it to the stream's time once the request has ended."""
    return max(4 * stream_ttl_s, int(2 * queued_s) + stream_ttl_s)


@dataclass(frozen=True, slots=True)
class Record:
    """A request as admission records it: its JSON (serialized once: its queue message is built
    from the same text, ``messages.prefill_job_json``) and its first read (``watcher``: the
    response's own, marked among the stream's readers in the same step, ``Watching.watch``'s
    round trip saved; "": none yet)."""

    request_id: str
    json: str
    watcher: str = ""

    @classmethod
    def of(cls, request: GenerationRequest, watcher: str = "") -> Record:
        return cls(request.request_id, request.model_dump_json(), watcher)


def admission(
    records: list[Record], images: list[bytes], reader: str, queued_s: float, ttl_s: int, queue: Queue
) -> tuple[list[str], list]:
    """``ADMIT``'s keys and arguments: record each request, its images' bytes and the digest of who
    may read its stream; queued, its message pushed (when ``queue`` has one); its first read marked
    as its stream's reader (when it has one). The readers' set lives as long as the record, as
    ``Watching``'s does."""
    keep = record_s(queued_s, ttl_s)
    keys = [queue.stage, key("pushed", queue.stage), key("active")]
    args = [queue.bound, keep, int(queued_s * 1000), reader, len(images), *images]
    for record, message in zip(records, queue.messages or [""] * len(records), strict=True):
        rid = record.request_id
        keys += [key("req", rid), key("access", rid), key("queued", rid), key("images", rid), key("watchers", rid)]
        args += [rid, record.json, message, record.watcher]
    return keys, args
