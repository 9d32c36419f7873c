"""The gateway's access log names the requests each line answers: their ids (``X-Request-Id``, one
per choice) end the line, as the workers' lines name them (``request <id>: ...``). A client's
complaint carries the header; its access line could not be told from the others (uvicorn's line
is the client's address, the route and the status).

uvicorn logs a response's line as the app sends its start, in the app's task: ``name_answered``
puts the ids the response carries in a context variable just before, and the access handler's
``RequestIds`` filter adds them to the record (``%(request_ids)s`` in its format)."""

from __future__ import annotations

import copy
import logging
from contextvars import ContextVar

from starlette.types import Message
from uvicorn.config import LOGGING_CONFIG

_ANSWERED: ContextVar[str] = ContextVar("answered_request_ids", default="")


def answering() -> None:
    """A request's answer begins to be made: it names no request yet. (uvicorn starts a pipelined
    request, sent before the answer to the one ahead of it, from the task that answered that one: its
    context came along, and a probe's line named the request before it.)"""
    _ANSWERED.set("")


def name_answered(start: Message) -> None:
    """Before a response's ``start`` goes out (its access line is logged then): the request ids it
    carries, for that line (``CountResponses`` calls it for the API's responses: only they carry ids)."""
    ids = next((v for k, v in start.get("headers", ()) if k.lower() == b"x-request-id"), b"")
    _ANSWERED.set(ids.decode("latin-1"))


class RequestIds(logging.Filter):
    """Sets ``request_ids`` on each access record: `` request <ids>``, or nothing for a response
    that names none (a refusal before admission, a probe)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _ANSWERED.get()
        record.request_ids = f" request {ids}" if ids else ""
        return True


def access_log_config() -> dict:
    """uvicorn's logging configuration, its access lines ending with the requests' ids."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {**config.get("filters", {}), "request_ids": {"()": RequestIds}}
    config["handlers"]["access"]["filters"] = ["request_ids"]
    config["formatters"]["access"]["fmt"] += "%(request_ids)s"
    return config
