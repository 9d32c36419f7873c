"""Who may read a request's stream: the API key that created it, or (without keys) whoever
holds the resume token handed out with the response (``X-Resume-Token``; a browser's
EventSource, which cannot send headers, passes it as ``?resume_token=``). Redis keeps only
a digest of either, under ``dz:access:{id}``."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request

from .context import Gateway

TOKEN_HEADER = "X-Resume-Token"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(authorization: str | None) -> str:
    """The key of an ``Authorization: Bearer KEY`` header; "" for none or another scheme."""
    scheme, _, key = (authorization or "").strip().partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def key_accepted(offered: str, keys: list[str]) -> bool:
    """Whether ``offered`` (a bearer key as the server decoded its header: latin-1) is one of
    ``keys`` (printable ASCII: settings refuse others), each compared in constant time on the bytes
    the client sent."""
    sent = offered.encode("latin-1", "replace")
    return any([hmac.compare_digest(sent, key.encode()) for key in keys])  # every key compared


def _bearer(http: Request) -> str:
    return bearer(http.headers.get("authorization"))


UNREADABLE = ""  # the digest of a request answered in one body: no key or token matches it


def credential(gw: Gateway, http: Request, streamed: bool) -> tuple[str, dict[str, str]]:
    """The digest new requests are bound to, and the headers that hand out a fresh token. A request
    answered in one body is nobody's to read again: its client has the whole answer (its id comes
    only with it: nobody could resume it while it ran, and the client's leaving cancelled it at
    once); its finished stream, replayed from its URL, was the body again in chunks."""
    if not streamed:
        return UNREADABLE, {}
    if gw.settings.api_keys:
        return _digest(_bearer(http)), {}
    token = secrets.token_urlsafe(24)
    return _digest(token), {TOKEN_HEADER: token}


async def may_read(gw: Gateway, http: Request, request_id: str) -> bool:
    stored = await gw.bus.watching.reader(request_id)
    if stored is None:
        return False
    if gw.settings.api_keys:
        offered = _bearer(http)
    else:
        offered = http.headers.get(TOKEN_HEADER) or http.query_params.get("resume_token") or ""
    return hmac.compare_digest(stored.decode(), _digest(offered))
