"""A worker's stop ends its process once Celery's warm shutdown is done: its exit handlers run, the
interpreter's teardown of every module (torch, transformers, Celery: most of a stop's seconds) does
not; its queue read blocked in Redis ends as the stop begins. A real stack's worker, SIGTERMed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import redis

from dayzero.params import SamplingParams
from dayzero.procs import free_port
from dayzero.serving.keys import key
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.queue import composer, make_celery
from dayzero.settings import Settings
from dayzero.stack import Stack

from .conftest import SETTINGS_ENV, wait_until

# Loaded by every Python process of the stack (PYTHONPATH): marks, by pid, that its exit handlers ran
# and that its modules were torn down (an object of this module's finalized with them).
PROBE = """
import atexit, os

class _TornDown:
    def __init__(self, path):  # (os's functions kept: the module may be torn down first)
        self.path, self.open, self.close, self.flags = path, os.open, os.close, os.O_CREAT | os.O_WRONLY

    def __del__(self):
        self.close(self.open(self.path, self.flags))

_torn_down = _TornDown(os.path.join({out!r}, f"torn-down-{{os.getpid()}}"))
atexit.register(lambda: open(os.path.join({out!r}, f"exit-handlers-{{os.getpid()}}"), "w").close())
"""


def test_a_stopped_worker_runs_its_exit_handlers_and_skips_the_interpreter_teardown(text_dir, tmp_path):
    site, out = tmp_path / "site", tmp_path / "marks"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(PROBE.format(out=str(out)))
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {"DAYZERO_CHECKPOINT": str(text_dir), "DAYZERO_KV_BUDGET_MB": "32", "PYTHONPATH": path}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path / "logs", env)
    stack.start()
    try:
        worker = stack.child("prefill0").proc
        log = tmp_path / "logs" / "prefill0.log"
        assert wait_until(lambda: " ready." in log.read_text(), 120), "not started"  # (Celery's SIGTERM handler in)
    finally:
        killed = stack.stop()
    assert killed == [] and worker.returncode == 0
    assert (out / f"exit-handlers-{worker.pid}").exists()  # logging's flush, multiprocessing's cleanup, ...
    assert not (out / f"torn-down-{worker.pid}").exists()  # (was: 1.5-4 s of a 2-5 s stop)


def test_a_worker_that_ends_on_an_error_exits_non_zero(text_dir, redis_url, tmp_path):
    """Its queue's binding key holds another type: Celery's consumer fails for good (WRONGTYPE,
    "Unrecoverable error") and the worker ends. Its exit code says so (was: 0, Celery's code dropped
    by ``worker_main``: a supervisor's restart-on-failure, a healthcheck on exit, never saw a failure)."""
    r = redis.Redis.from_url(redis_url)
    r.set("_kombu.binding.prefill", "not a set")
    env = {**os.environ, **SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(text_dir), "DAYZERO_REDIS_URL": redis_url}
    try:
        ended = subprocess.run(
            [sys.executable, "-m", "dayzero.cli", "serve", "prefill", "--name", "prefill0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        r.delete("_kombu.binding.prefill")
    assert "Unrecoverable error" in ended.stderr and ended.returncode == 1, ended.stderr[-3000:]


def _watch_prefill_queue(url: str, reads: threading.Event, pushes: list[str]) -> None:
    """Until Redis stops: set ``reads`` at the first read of prefill's queue, and keep each push onto
    it (a command's text, Redis's order: MONITOR)."""
    with contextlib.suppress(redis.RedisError, OSError), redis.Redis.from_url(url).monitor() as commands:
        for command in commands.listen():
            text = command["command"]
            if text.startswith("BRPOP prefill "):
                reads.set()
            elif text.startswith(("LPUSH prefill ", "RPUSH prefill ", "ECHO ")):
                pushes.append(text)


def test_a_stopping_worker_takes_no_message_pushed_after_its_stop_began(text_dir, tmp_path):
    """Celery notices a stop when its consumer's queue read returns: a BRPOP blocked in Redis up to
    1 s (kombu's poll; ~0.5 s of every stop), which took the next message pushed meanwhile: the task
    then ran on a worker on its way out, or, its consumer already cancelled, kombu pushed it back.
    The stop now ends that read as it begins: a message pushed once the worker has left the registry
    stays where it was put, untouched, for another worker."""
    env = {"DAYZERO_CHECKPOINT": str(text_dir), "DAYZERO_KV_BUDGET_MB": "32"}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path / "logs", env)
    stack.start()
    try:
        r, worker = redis.Redis.from_url(stack.redis_url), stack.child("prefill0").proc
        assert wait_until(lambda: r.hlen(key("workers", "prefill")) == 1, 120), "not started"
        reads, pushes = threading.Event(), []
        threading.Thread(target=_watch_prefill_queue, args=(stack.redis_url, reads, pushes), daemon=True).start()
        assert reads.wait(30)  # a read just sent: its poll would end it ~1 s from now
        worker.send_signal(signal.SIGTERM)
        assert wait_until(lambda: r.hlen(key("workers", "prefill")) == 0, 30, step_s=0.001)  # it left
        request = GenerationRequest(
            request_id="late", prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=4), created=time.time()
        )
        r.lpush("prefill", composer(make_celery(Settings()), "prefill")(PrefillJob(request=request)))
        assert worker.wait(30) == 0
        r.echo("stopped")  # (the last command the watch waits for)
        assert wait_until(lambda: pushes[-1:] == ["ECHO stopped"], 10)
        # (was: none left, the task run by the stopping worker; or it was pushed back by kombu)
        assert r.llen("prefill") == 1 and len(pushes) == 2, pushes
    finally:
        stack.stop()
