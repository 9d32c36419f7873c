"""A real uvicorn server in a thread, with the HTTP protocol under test, for raw-socket clients."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from dayzero.procs import free_port


@contextmanager
def serving(app, protocol: type) -> Iterator[int]:
    """``app`` served with ``protocol`` on a free port (yielded) until the block ends, then stopped."""
    config = uvicorn.Config(app, port=free_port(), http=protocol, lifespan="off", log_level="warning")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not running.started and time.time() < deadline:
        time.sleep(0.02)
    try:
        yield config.port
    finally:
        running.should_exit = True
        thread.join(10)
        assert not thread.is_alive()
