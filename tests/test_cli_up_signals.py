"""`dayzero up` stopped by SIGINT or SIGTERM before its stack starts, as a background job (`dayzero
up &`, which inherits SIGINT ignored) is stopped; its stop after a failed start; the handlers it
hands back."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from dayzero import cli


def _writer_once_read(fifo, process: subprocess.Popen, within: float) -> int:
    """The FIFO's write end, opened once ``process`` opened it to read (it then waits in its read)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # (no reader yet)
                raise
            time.sleep(0.05)
    pytest.fail(f"up never read its config.json (exit {process.poll()})")


@pytest.mark.parametrize(
    ("signum", "code", "said"), [(signal.SIGINT, 130, "\ninterrupted\n"), (signal.SIGTERM, 143, "terminated\n")]
)
def test_a_signal_to_a_background_up_stops_it_during_its_checks(signum, code, said, tmp_path):
    """Up handled SIGINT only once its checks passed (seconds under load: the config, the weights'
    headers, the pools, the tokenizer), so a background job ignored a SIGINT sent meanwhile and
    started the stack anyway; a SIGTERM then was SIGINT's "interrupted", exit 130. A config.json
    that is a FIFO holds `up` in that window."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    os.mkfifo(checkpoint / "config.json")
    argv = [sys.executable, "-m", "dayzero.cli", "up", "--checkpoint", str(checkpoint), "--log-dir", str(tmp_path)]
    up = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as the shell starts `up &`
    )
    writer, ended = None, None
    try:  # (up is killed however this ends: one waiting on the FIFO would wait forever)
        writer = _writer_once_read(checkpoint / "config.json", up, within=120)
        up.send_signal(signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            ended = up.wait(timeout=20)
    finally:
        if writer is not None:
            os.close(writer)  # (a read still waiting ends: the config is empty)
        up.kill()
        err = up.communicate(timeout=30)[1]
    assert (ended, err) == (code, said)


def test_a_signal_during_the_stop_after_a_failed_start_does_not_cut_it_short(tiny_checkpoint, tmp_path, monkeypatch):
    """After a failed start (a child crash-looping, --ready-timeout) the stop ran with up's handlers
    live: a Ctrl-C then ended it where it was, and the groups it had not reached ran on (each in a
    session of its own)."""
    from dayzero import stack

    stopped = []

    def stop(self):
        os.kill(os.getpid(), signal.SIGINT)  # (the handler runs at the next bytecode)
        stopped.append("every group")
        return []

    def start(self):
        raise stack.StartFailed("gateway keeps exiting while starting")

    monkeypatch.setattr(stack.Stack, "start", start)
    monkeypatch.setattr(stack.Stack, "stop", stop)
    argv = ["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(tmp_path)]
    try:
        code = cli.main(argv)
    except KeyboardInterrupt:  # (what up's handler raised, out of the stop)
        code = "interrupted"
    assert (code, stopped) == (1, ["every group"])


def test_up_hands_back_the_signal_handlers_it_found(tmp_path):
    """A caller (a test's process) kept up's handlers, which ignore SIGINT and SIGTERM after a first."""
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    assert cli.main(["up", "--checkpoint", str(tmp_path)]) == 2  # (no config.json)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before


_IMPORT_HELD = """
import os, sys


class HeldImport:
    '''Holds the import of dayzero.cli (the commands) till the FIFO's writer closes it.'''

    def find_spec(self, name, path=None, target=None):
        if name == "dayzero.cli":
            with open(os.environ["HELD_IMPORT_FIFO"], "rb") as fifo:
                fifo.read()
        return None


sys.meta_path.insert(0, HeldImport())
"""


def test_a_signal_to_a_background_up_stops_it_while_it_imports(tmp_path):
    """`dayzero up &` ignored a SIGINT for its first ~1 s (2 s under load: the imports of its commands)
    and went on to start its stack. The import is held here on a FIFO (sitecustomize), a checkpoint
    that does not exist past it (an `up` that went on says so, exit 2)."""
    (tmp_path / "sitecustomize.py").write_text(_IMPORT_HELD)
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HELD_IMPORT_FIFO": str(fifo)}
    argv = [sys.executable, "-m", "dayzero", "up", "--checkpoint", str(tmp_path / "none"), "--log-dir", str(tmp_path)]
    up = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    writer, ended = None, None
    try:
        writer = _writer_once_read(fifo, up, within=60)
        up.send_signal(signal.SIGINT)
        time.sleep(0.5)  # (an `up` that ignored it is still held: closing the FIFO lets it go on)
        os.close(writer)
        writer = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            ended = up.wait(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        up.kill()
        err = up.communicate(timeout=30)[1]
    assert (ended, err) == (130, "\ninterrupted\n")


def test_a_stop_between_a_childs_fork_and_its_record_still_stops_that_child(tmp_path, monkeypatch):
    """A SIGINT that reached `up` after a child's fork, before its Popen was kept on the stack, raised
    there: the child was left out of the ordered stop (killed only at up's own exit, its pool segment
    left behind). The stop is handled once the child is kept; here it arrives right after the embedded
    Redis's fork."""
    from dayzero import cli_up, procs
    from dayzero.stack import Stack

    forked = []

    def spawn_then_stop(*args, **kwargs):
        forked.append(real_spawn(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)  # (its handler runs at the next bytecode: here)
        for _ in range(1000):
            pass
        return forked[-1]

    real_spawn = procs.spawn
    monkeypatch.setattr(procs, "spawn", spawn_then_stop)  # (start_redis's)
    stack = Stack({"vision": 0, "prefill": 0, "decode": 0}, procs.free_port(), tmp_path)
    try:
        with cli_up._stop_on_signals(), pytest.raises(cli_up._Stop):
            stack.start()
        stack.stop()
        assert forked and forked[0].poll() is not None, "the embedded Redis outlived up's stop"
    finally:
        for proc in forked:
            proc.kill()
            proc.wait()


_SIGINT_SEEN = """
import signal
import dayzero.cli

signal.signal(signal.SIGINT, signal.SIG_IGN)  # (as a shell starts a background job: `dayzero quantize ... &`)
dayzero.cli.main = lambda argv: print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN) or 0
from dayzero.__main__ import main

main([])
"""


def test_the_entry_point_gives_a_command_the_sigint_it_inherited():
    """The entry point handles SIGINT while it imports the commands, and left it handled: a background
    job's command that handles no SIGINT of its own (quantize, generate: not up, not a server) died of
    the Ctrl-C its shell meant for the foreground (Python keeps an inherited SIG_IGN)."""
    said = subprocess.run([sys.executable, "-c", _SIGINT_SEEN], capture_output=True, text=True, timeout=120)
    assert (said.returncode, said.stdout) == (0, "True\n"), said.stderr[-2000:]
