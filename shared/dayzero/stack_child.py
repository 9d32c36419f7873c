"""One child of ``dayzero up``'s stack (stack.py) and when it starts again after an exit.

A child that exits before it has run ``RAN_A_WHILE_S`` ready (a setting or a Redis user it cannot
start with; an ACL refusing its script load, an out-of-memory warm-up, once its weights have
loaded) again and again waits before its next start, twice as long each time; one exit so (a
kill), or one after a while ready, is started again at once. The run counts from when up first saw
the child ready, on the monotonic clock: counted from its spawn, a worker whose load took longer
than ``RAN_A_WHILE_S`` and that exited as it became ready was started again at once, for ever.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

RAN_A_WHILE_S = 60.0  # a child's second exit in a row within this of being ready (or unready) waits
FIRST_WAIT_S = 1.0  # that wait, doubled at each exit so after it, up to
LONGEST_WAIT_S = 60.0


@dataclass
class Child:
    name: str
    service: str  # one of SERVICES, or "redis" (the embedded one)
    proc: object | None = None  # subprocess.Popen
    restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # its own settings beside the stack's
    why: str = "exited"  # why it was last restarted
    started: float = 0.0  # when its process was spawned (time.monotonic())
    ready_at: float | None = None  # when up first saw that process ready (time.monotonic()); None: not yet
    quick_exits: int = 0  # its exits in a row, each before it had run RAN_A_WHILE_S ready
    wait_s: float = 0.0  # how long it waits to start again after its last exit (0: at once)
    due: float | None = None  # when it starts again (time.monotonic()), while it waits

    def exited(self) -> None:
        """Its process exited: when it starts again. At once after a run of ``RAN_A_WHILE_S`` ready
        (a crash mid-run) or a first quick exit (a kill); after a wait from the second quick exit in a
        row on, twice the last one's (a child refused at its start check was started again every 10-17 s
        for ever)."""
        ran_s = -1.0 if self.ready_at is None else time.monotonic() - self.ready_at
        self.quick_exits = 0 if ran_s >= RAN_A_WHILE_S else self.quick_exits + 1
        doubled = min(LONGEST_WAIT_S, max(FIRST_WAIT_S, 2 * self.wait_s))
        self.wait_s = doubled if self.quick_exits > 1 else 0.0
        self.due = time.monotonic() + self.wait_s if self.wait_s else None
        self.ready_at = None

    def held_back(self) -> bool:
        """Waiting out its wait after quick exits, or started after it and not seen ready yet (up's
        ``wait_ready`` returned once it was started: its stage served by another worker, it still loading)."""
        return self.due is not None or (self.wait_s > 0 and self.ready_at is None)

    def restart_said(self) -> str:
        """The supervisor's line for its restart (started again after its wait: that it is not ready yet)."""
        if self.due is not None:
            return (
                f"{self.name} {self.why}, {self.quick_exits} times in a row before it had run {RAN_A_WHILE_S:g} s "
                f"ready; starting it again in {self.wait_s:g} s"
            )
        if self.held_back():
            return f"{self.name} {self.why}; started again after a wait of {self.wait_s:g} s, not ready yet"
        return f"{self.name} {self.why}; restarted"
