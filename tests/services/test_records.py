"""The token-stream record: what a stage appends is what the gateway reads, field for field."""

from __future__ import annotations

from dayzero.serving.records import Token, decode, encode, ending


def _as_redis_returns(fields: dict) -> dict[bytes, bytes]:
    return {k.encode(): str(v).encode() for k, v in fields.items()}


def test_a_full_record_round_trips():
    token = Token(
        "req",
        0,
        42,
        "héllo",
        "length",
        {"prompt_tokens": 3, "completion_tokens": 1},
        -0.125,
        ((42, -0.125), (7, -2.5)),
        [(-1.5, ((5, -0.5),)), (-0.25, ())],
    )
    assert decode("req", _as_redis_returns(encode(token))) == token


def test_a_bare_token_and_an_ending_round_trip():
    bare = Token("req", 5, 9, "")
    closing = ending("req", 6, "error", "sampling failed: ValueError")
    assert decode("req", _as_redis_returns(encode(bare))) == bare
    got = decode("req", _as_redis_returns(encode(closing)))
    assert got == closing and got.token == -1 and got.entry_id == "7-0"
