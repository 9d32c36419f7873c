"""A process's peak resident set over a stretch of its work (Linux). ``ru_maxrss`` and VmHWM keep the
peak since the process began (``ru_maxrss`` even the parent's, over exec), so a stretch that peaks
below an earlier peak (loading a model, the parent's imports) read as 0 MiB above its start; here the
kernel's high-water mark is reset at the start (``/proc/self/clear_refs``) and read at the end."""

from __future__ import annotations

from pathlib import Path


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(f"{field}:"))
    return int(line.split()[1])


def start_peak() -> int:
    """Resets this process's peak resident set to its resident set now; returns that (KiB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def peak_above(start_kib: int) -> float:
    """MiB the resident set peaked above ``start_kib`` (``start_peak``'s) since then."""
    return (_status_kib("VmHWM") - start_kib) / 1024
