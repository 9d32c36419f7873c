"""``dayzero up`` notes when it first sees each worker ready (``Stack._see_ready``): its back-off
counts a run from then (stack_child.py). A worker is seen ready once the stage's ready stamps name its
process ("{host}:{pid}"); a ready stamp from before the child's spawn is another process's, under a pid
used again (a worker SIGKILLed leaves its stamps for ``FORGET_S``), as ``Stack.frozen`` already reads
an alive stamp so. Taken for the child's, a worker still loading counted as ready: its crash in the
warm-up, after a load of over ``RAN_A_WHILE_S``, was a run of a while, started again at once, for ever.

The worker here never stamps by itself: the test writes its stamps (the workers' own script)."""

from __future__ import annotations

import socket
import subprocess
import time

from dayzero.procs import scratch_redis
from dayzero.serving.keys import key
from dayzero.serving.liveness import STAMP, connect, process_id
from dayzero.stack import Child, Stack


def test_a_ready_stamp_from_before_a_workers_spawn_is_not_its_own(redis_url, tmp_path):
    client = connect(redis_url)
    script = client.register_script(STAMP)
    keys = [key("alive", "prefill"), key("ready", "prefill"), key("stamp_now")]
    worker = subprocess.Popen(["sleep", "300"])
    process = process_id(worker.pid, socket.gethostname())
    try:
        script(keys=keys, args=[process, "now", ""])  # an earlier process under this pid, ready
        time.sleep(0.2)
        child = Child("prefill0", "prefill", proc=worker, started=time.monotonic())  # spawned after it
        stack = Stack({}, 0, tmp_path, redis_url=redis_url, children=[child])
        stack.supervise()
        assert child.ready_at is None, "another process's ready stamp, from before the spawn, was taken for its own"
        script(keys=keys, args=[process, "", ""])  # its own first stamp: loading
        stack.supervise()
        assert child.ready_at is None
        script(keys=keys, args=[process, "now", ""])  # loaded: ready
        stack.supervise()
        assert child.ready_at is not None
    finally:
        worker.kill()
        worker.wait()
        client.delete(*keys)


def test_one_read_of_the_stamps_a_pass_serves_both_the_ready_and_the_frozen_check(tmp_path):
    """A ``supervise()`` pass read the starting workers' stamps (``_see_ready``: one round trip), then
    every stage's again for ``frozen`` (one per stage): four reads of Redis's time a pass. One read
    (``stack_stamps.StampReader``) serves both now: Redis's own count of TIME calls says so (two: the
    read's and its write check's, which dates when Redis ran it)."""
    with scratch_redis(tmp_path) as port:
        url = f"redis://127.0.0.1:{port}/0"
        client = connect(url)
        worker = subprocess.Popen(["sleep", "300"])
        try:
            child = Child("prefill0", "prefill", proc=worker, started=time.monotonic())
            stack = Stack({}, 0, tmp_path, redis_url=url, children=[child], frozen_s=30.0)
            keys = [key("alive", "prefill"), key("ready", "prefill"), key("stamp_now")]
            client.register_script(STAMP)(keys=keys, args=[process_id(worker.pid, socket.gethostname()), "now", ""])
            reads = []
            for _ in range(2):  # starting (seen ready in the first), then running
                client.config_resetstat()
                stack.supervise()
                reads.append(client.info("commandstats").get("cmdstat_time", {}).get("calls", 0))
            assert child.ready_at is not None
            assert reads == [2, 2], f"TIME calls in each of two passes: {reads}"
        finally:
            worker.kill()
            worker.wait()
