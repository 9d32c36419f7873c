"""``unlink_pools_by`` and ``unlink_parked_by`` get the pids of children the supervisor saw exit
(``Stack.stop``: after its Redis's stop too, up to ``stop_timeout_s`` later; ``supervise``: at its
next pass; ``vision_pids``: every vision process the stack started, hours ago too). A pid is free
once its process is reaped, and the next process the host starts may get it (pid_max is 32768 in
many containers): a live worker of another stack under that pid had its pool segment unlinked (each
decode worker that had not mapped it yet failed every handoff from it), or its parked embeddings.
Real processes; the segments are files in a folder of the test's."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dayzero.shm import unlink_parked_by, unlink_pools_by

from .conftest import wait_until


@pytest.mark.parametrize(
    ("unlink", "name"),
    [(unlink_pools_by, "dz-kv-{pid}-0123abcd"), (unlink_parked_by, "dz-parked-1700000000000-{pid}-0123abcd.req.0")],
)
def test_a_pid_used_again_by_a_live_process_keeps_its_segment(
    unlink: Callable[..., list[str]], name: str, tmp_path: Path
):
    exited = subprocess.Popen(["true"])
    exited.wait()  # a child that exited and was reaped: its segment is a leftover
    reused = subprocess.Popen(["sleep", "60"])  # a live process under a pid the supervisor still holds
    try:
        for pid in (exited.pid, reused.pid):
            (tmp_path / name.format(pid=pid)).write_bytes(b"x")
        assert unlink([exited.pid, reused.pid], tmp_path) == [name.format(pid=exited.pid)]
        assert [p.name for p in tmp_path.iterdir()] == [name.format(pid=reused.pid)]
    finally:
        reused.kill()
        reused.wait()


def test_a_pid_of_an_exited_process_not_reaped_yet_is_unlinked(tmp_path: Path):
    """A zombie holds its pid until its parent waits for it (a supervisor killed: its children's new
    parent, an init that reaps nothing): no live process uses its segment."""
    exited = subprocess.Popen(["true"])
    try:
        stat = Path(f"/proc/{exited.pid}/stat")
        assert wait_until(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", 30)
        (tmp_path / f"dz-kv-{exited.pid}-0123abcd").write_bytes(b"x")
        assert unlink_pools_by([exited.pid], tmp_path) == [f"dz-kv-{exited.pid}-0123abcd"]
    finally:
        exited.wait()
