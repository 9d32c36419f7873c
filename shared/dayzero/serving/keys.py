"""The names of dayzero's keys in Redis (what each holds: lifecycle.py's table)."""

from __future__ import annotations

P = "dz:"
HANDOFF_OWNER = "handoff"
QUEUES = ("vision", "prefill", "decode")  # the stages whose messages are counted (a mark says which)


def key(family: str, name: str = "") -> str:
    """``dz:{family}:{name}`` (``dz:{family}`` for the global ones: active, reaper)."""
    return f"{P}{family}:{name}" if name else f"{P}{family}"
