"""Reading one config.json value: its type and range checked, a ConfigError naming the key."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config.json dayzero cannot serve; the message names the field."""


# Each key is read by one of these: the type and range it must have sit beside its default.
def get_value(raw: dict[str, Any], key: str, default: Any) -> Any:
    value = raw.get(key, default)
    return default if value is None else value


def get_int(raw: dict[str, Any], key: str, default: int | None, least: int = 1) -> int:
    value = get_value(raw, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ConfigError(f"{key} must be {kind}, got {value!r}")
    return value


def get_float(raw: dict[str, Any], key: str, default: float) -> float:
    value = get_value(raw, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigError(f"{key} must be a number above 0, got {value!r}")
    return float(value)


def get_json(raw: dict[str, Any], key: str, kind: type[dict | list]) -> Any:
    """None when absent, else a ``kind``: dict (a JSON object) or list."""
    value = raw.get(key)
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{key} must be a JSON {'object' if kind is dict else 'list'}, got {value!r}")
    return value
