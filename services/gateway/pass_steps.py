"""The reaper pass's steps, each on its own: one that raises anything but a Redis error (a bug, a
record it cannot read) is logged once, with its trace, and the pass goes on to the next step. As
one block, the first step failing skipped the ones after it at every pass (the ends of the waits
at a stage nobody serves, the cancels a stopped gateway left), logged at every pass. A Redis error
ends the pass (the others would fail too: reaping.py's loop counts the outage). Each pass tells which
steps Redis failed nothing of (``ran``: one failing otherwise too) and at which one Redis failed it
(``failed_at``): a command refused at a step that only some passes run (the re-run's, skipped for a
lease after a failed pass) is refused until that step goes through, not until a pass that skipped it
does (CommandRefused); one that then fails on a record it cannot read kept the refusal for ever."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

log = logging.getLogger("dayzero.gateway")


class PassSteps:
    def __init__(self) -> None:
        self._failing: set[str] = set()  # the steps whose last run raised (logged once)
        self.ran: set[str] = set()  # the steps of this pass Redis failed nothing of (one failing otherwise too)
        self.failed_at: str | None = None  # the step of this pass Redis failed (None: none, or outside a step)

    def begin(self) -> None:
        """A new pass."""
        self.ran, self.failed_at = set(), None

    def run(self, step: str, work: Callable[..., Any], *args: Any) -> None:
        """``work(*args)``; a failure other than Redis's logged (once until it goes through again)."""
        try:
            work(*args)
        except redis.RedisError:
            self.failed_at = step
            raise
        except Exception:
            # (Redis failed it nothing: a refusal met at it is taken back, not kept while this fails it)
            self.ran.add(step)
            if step not in self._failing:
                log.exception("the reaper's %s failed; it is tried again each pass, the other steps go on", step)
                self._failing.add(step)
            return
        self.ran.add(step)
        if step in self._failing:
            log.warning("the reaper's %s went through again", step)
            self._failing.discard(step)
