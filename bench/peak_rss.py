"""A process's peak resident set over a stretch of its work (Linux). ``ru_maxrss`` and VmHWM keep the
peak since the process began (``ru_maxrss`` even the parent's, over exec), so a stretch that peaks
below an earlier peak (loading a model, the parent's imports) read as 0 MiB above its start; here the
kernel's high-water mark is reset at the start (``/proc/self/clear_refs``) and read at the end.

A kernel without that reset (no ``clear_refs``: before Linux 4.0, gVisor; or /proc mounted
read-only) gets a fallback, said once on stderr: the resident set sampled every ``SAMPLE_S`` by a
thread (a spike shorter than that can be missed; the sampler takes a little of the CPU measured)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

CLEAR_REFS = Path("/proc/self/clear_refs")
SAMPLE_S = 0.001


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(f"{field}:"))
    return int(line.split()[1])


class PeakRSS:
    """The peak resident set of this process from its construction (the stretch's start) to ``mib``."""

    def __init__(self) -> None:
        self._sampler: threading.Thread | None = None
        try:
            CLEAR_REFS.write_text("5")  # the high-water mark := the resident set now
        except OSError as exc:
            every = f"{SAMPLE_S * 1e3:g} ms"
            print(f"peak_rss: cannot reset the peak ({exc}): sampling VmRSS every {every}", file=sys.stderr)
            self._stop = threading.Event()
            self._sampler = threading.Thread(target=self._sample, daemon=True)
        self.start_kib = self._sampled_kib = _status_kib("VmRSS")
        if self._sampler is not None:
            self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sampled_kib = max(self._sampled_kib, _status_kib("VmRSS"))

    def mib(self) -> float:
        """MiB the resident set peaked above its start since then."""
        if self._sampler is None:
            return (_status_kib("VmHWM") - self.start_kib) / 1024
        self._stop.set()
        self._sampler.join()
        return (max(self._sampled_kib, _status_kib("VmRSS")) - self.start_kib) / 1024
