"""``Stack.wait_ready`` with a worker held back after quick exits (stack_child.py) while another
worker of its stage serves: /ready answers 200 throughout. It returned once that worker was started
again, still loading (``up`` said "ready" with it down; a bench went on with one prefill worker
fewer). It returns once the worker is seen ready. A gateway stand-in answers /ready 200 (as one whose
prefill0 and decode0 serve), and prefill1's process writes its ready stamp (the workers' script) 1.5 s
after its start, as a worker done loading: a real stack took over a minute here for the same wait."""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time

import dayzero.stack
from dayzero.procs import free_port, scratch_redis
from dayzero.stack import Child, Stack

LOADS_FOR = """
import os, socket, sys, time
from dayzero.serving.keys import key
from dayzero.serving.liveness import STAMP, connect, process_id
client = connect(sys.argv[1])
time.sleep(1.5)
keys = [key("alive", "prefill"), key("ready", "prefill"), key("stamp_now")]
client.register_script(STAMP)(keys=keys, args=[process_id(os.getpid(), socket.gethostname()), "now", ""])
time.sleep(300)
"""


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_) -> None:
        pass


def test_wait_ready_waits_for_a_worker_started_after_its_wait_to_be_ready(tmp_path, monkeypatch):
    spawn = dayzero.stack.spawn
    gateway = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Ready)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    with scratch_redis(tmp_path) as port:
        url = f"redis://127.0.0.1:{port}/0"
        loading = lambda cmd, log, env: spawn([sys.executable, "-c", LOADS_FOR, url], log, dict(os.environ))
        monkeypatch.setattr(dayzero.stack, "spawn", loading)
        # as a worker is after its second exit in a row before it had run a while ready: its start 1 s on
        held = Child("prefill1", "prefill", restarts=2, why="exited (code 3)", quick_exits=2, wait_s=1.0)
        held.due = time.monotonic() + 1.0
        stack = Stack({}, gateway.server_address[1], tmp_path, redis_url=url, children=[held])
        try:
            stack.wait_ready(timeout_s=30)
            assert held.proc is not None and held.proc.poll() is None
            assert held.ready_at is not None, "wait_ready returned with prefill1 started, not ready yet"
        finally:
            stack.stop()
            gateway.shutdown()
