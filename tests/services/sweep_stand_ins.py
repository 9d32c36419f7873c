"""The sweep as the refusal tests run it: the real one (``SWEEP``) over a store whose read of its
requests' list (the sweep's first read under its lock) runs something first."""

from __future__ import annotations

from collections.abc import Callable

from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from services.gateway import reaping

SWEEP = reaping.sweep  # (the real one, which the stand-ins call: tests patch reaping's)


class ActiveRead:
    """``store`` whose sweep runs ``before`` just before it reads its requests' list, read in id order."""

    def __init__(self, store: Lifecycle, before: Callable[[], object] = lambda: None) -> None:
        self.store, self.before = store, before

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def active(self) -> list[str]:
        self.before()
        return sorted(self.store.active())


def sweep_sending_lrange_under_its_lock(store: Lifecycle, *args):
    """The sweep, sending LRANGE once it holds its lock (the lock's refused sweeps: the real one's)."""
    return SWEEP(ActiveRead(store, lambda: store.r.lrange(key("sweep-only"), 0, 0)), *args)
