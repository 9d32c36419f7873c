"""``dayzero up``'s claim on its --log-dir (LOG_DIR/up.lock) where the filesystem cannot lock."""

from __future__ import annotations

import errno
import os

from dayzero import cli, cli_up


def test_a_log_dir_on_a_filesystem_without_flock_still_runs_up(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """An NFSv3 mount without lockd answers flock with ENOLCK: ``up`` ended there, "error: [Errno 37] No
    locks available", starting nothing, where before the lock it ran. It runs, and says what it cannot check."""
    from dayzero import stack

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    def start(self):
        raise stack.StartFailed("started")

    monkeypatch.setattr(cli_up.fcntl, "flock", flock)  # (the fcntl module, while this test runs)
    monkeypatch.setattr(stack.Stack, "start", start)
    logs = tmp_path / "logs"
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(logs)]) == 1
    err = capsys.readouterr().err
    assert err.endswith("error: started\n"), err
    assert f"warning: --log-dir {logs} cannot be locked (No locks available): a second up" in err
    assert (logs / "up.lock").read_text() == f"{os.getpid()}\n"
