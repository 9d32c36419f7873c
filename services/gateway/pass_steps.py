"""The reaper pass's steps, each on its own: one that raises anything but a Redis error (a bug, a
record it cannot read) is logged once, with its trace, and the pass goes on to the next step. As
one block, the first step failing skipped the ones after it at every pass (the ends of the waits
at a stage nobody serves, the cancels a stopped gateway left), logged at every pass. A Redis error
ends the pass (the others would fail too: reaping.py's loop counts the outage; a command refused:
refused_commands.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

log = logging.getLogger("dayzero.gateway")


class PassSteps:
    def __init__(self) -> None:
        self._failing: set[str] = set()  # the steps whose last run raised (logged once)

    def run(self, step: str, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)``'s answer; a failure other than Redis's logged (once until it goes through
        again): None."""
        try:
            answer = work(*args)
        except redis.RedisError:
            raise
        except Exception:
            if step not in self._failing:
                log.exception("the reaper's %s failed; it is tried again each pass, the other steps go on", step)
                self._failing.add(step)
            return None
        if step in self._failing:
            log.warning("the reaper's %s went through again", step)
            self._failing.discard(step)
        return answer
