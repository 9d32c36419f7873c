"""`dayzero up` and `serve` as commands: what they refuse before starting anything, and what
they hand their children."""

from __future__ import annotations

import re

import pytest

from dayzero import cli

from .conftest import run_dayzero

pytestmark = pytest.mark.usefixtures("roomy_host")  # (up's pool room check: not this machine's)
# an up run as a command: pools that fit docker's 64 MiB /dev/shm (up's room check is not what it tests)
FITS_A_SMALL_SHM = {"DAYZERO_KV_BUDGET_MB": "8"}


def test_up_and_serve_help_list_every_setting_within_a_readable_width():
    """Each setting with its default; argparse prints the settings (and up's description) as they
    are written, which were lines of up to 250 columns."""
    import os

    from dayzero.settings import Settings

    for command in ("up", "serve"):
        out = run_dayzero(command, "--help", env={**os.environ, "COLUMNS": "80"}).stdout
        missing = [name for name in Settings.model_fields if f"DAYZERO_{name.upper()}" not in out]
        assert not missing, (command, missing)
        assert max(map(len, out.splitlines())) <= 100, command
    assert "DAYZERO_DEVICE" in out and "cuda_ipc" in out and "DAYZERO_DTYPE                        dense weights" in out


def test_up_refuses_what_it_could_never_make_ready(tmp_path, capsys, monkeypatch):
    """Vision workers that do not match the checkpoint, or no checkpoint at all: one line, no stack.
    (In this process, as the refusals below: each `up` in a process of its own imported torch again.)"""
    from dayzero import stack
    from dayzero.demo import write_demo_checkpoint

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    with_vision, text = write_demo_checkpoint(tmp_path / "v", vision=True), write_demo_checkpoint(tmp_path / "t")
    logs, nowhere, config = tmp_path / "logs", tmp_path / "nowhere", text / "config.json"
    capsys.readouterr()  # (the checkpoints' progress bars)

    def refused(*args: str) -> str:
        assert cli.main(["up", *args, "--log-dir", str(logs)]) == 2
        return capsys.readouterr().err.strip()

    assert refused("--checkpoint", str(with_vision), "--vision", "0") == (
        f"error: {with_vision} has a vision tower: serving it needs --vision 1 or more"
    )
    assert refused("--checkpoint", str(text), "--vision", "1") == (
        f"error: {text} has no vision tower: --vision must be 0"
    )
    assert refused("--checkpoint", str(nowhere)) == f"error: checkpoint directory {nowhere} does not exist"
    assert refused("--checkpoint", str(config)) == f"error: {config} is a file: give the checkpoint's directory"
    assert not logs.exists()  # nothing was started


@pytest.mark.parametrize("variable", ["DAYZERO_REDIS_URL", "REDIS_URL"])
def test_up_uses_the_redis_it_is_given(variable, tiny_checkpoint, tmp_path, monkeypatch):
    """DAYZERO_REDIS_URL, the setting ``up --help`` lists, as well as REDIS_URL (up started its
    embedded Redis and handed that to the children over the setting)."""
    from dayzero import stack

    started = []

    def start(self):
        started.append(self.redis_url)
        raise stack.StartFailed("enough")

    monkeypatch.setattr(stack.Stack, "start", start)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv(variable, "redis://127.0.0.1:6391/2")
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(tmp_path / "logs")]) == 1
    assert started == ["redis://127.0.0.1:6391/2"]


@pytest.mark.parametrize(
    ("url", "starred", "why"),
    [
        ("redis://:secret@127.0.0.1:{port}/0", "redis://:***@127.0.0.1:{port}/0", "Connection refused"),
        (  # no sentinel answers (was: redis-py's text, ~1,500 characters of client reprs)
            "redis+sentinel://:secret@127.0.0.1:{port}/dz/0?sentinel_password=secret",
            "redis+sentinel://:***@127.0.0.1:{port}/dz/0?sentinel_password=***",
            "no sentinel (127.0.0.1:{port}) named the master 'dz': Error 111 connecting to 127.0.0.1:{port}.",
        ),
    ],
)
def test_up_gives_up_on_a_redis_it_is_given_that_does_not_answer(url, starred, why, tiny_checkpoint, tmp_path):
    """DAYZERO_REDIS_URL to a closed port: up started the gateway and the workers and waited for ever
    (without --ready-timeout), printing "waiting: redis unreachable" every 10 s."""
    import os
    import subprocess
    import sys

    from dayzero.procs import free_port

    closed, logs = free_port(), tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | FITS_A_SMALL_SHM
    env["DAYZERO_REDIS_URL"] = url.format(port=closed)
    env["DAYZERO_REDIS_ANSWER_WITHIN_S"] = "1"  # (its default, 10 s, waited out here)
    argv = [sys.executable, "-m", "dayzero.cli", "up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(logs)]
    argv += ["--port", str(free_port())]
    # (without the bound: killed here, its children with it)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the Redis at {starred.format(port=closed)} (DAYZERO_REDIS_URL or REDIS_URL)")
    assert "secret" not in done.stderr and "unset both to run an embedded one" in last
    assert why.format(port=closed) in last and "did not answer within 1 s: " in last and len(last) < 400, last
    assert not (logs / "gateway.log").exists()  # nothing was started


def test_up_prints_a_redis_url_without_its_password_and_how_long_it_has_waited(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    """``starting: redis redis://:secret@...`` printed the password of the URL it was given, and each
    ``waiting: ...`` line (every 10 s, without end without --ready-timeout) said nothing of how long."""
    from dayzero import stack

    def wait_ready(self, timeout_s, on_wait, on_restart=None):
        on_wait({"reason": "redis unreachable: Error 111 connecting to 10.0.0.2:6379. Connection refused."})
        raise TimeoutError("enough")

    monkeypatch.setattr(stack.Stack, "start", lambda self: None)
    monkeypatch.setattr(stack.Stack, "wait_ready", wait_ready)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("DAYZERO_REDIS_URL", "redis://default:s3cret@10.0.0.2:6379/0")
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(tmp_path / "logs")]) == 1
    err = capsys.readouterr().err
    assert "starting: redis redis://default:***@10.0.0.2:6379/0, gateway" in err and "s3cret" not in err, err
    assert re.search(r"^waiting \(\d+ s\): redis unreachable: Error 111 ", err, re.MULTILINE), err


@pytest.mark.parametrize("log_dir", ["/proc/dayzero-logs", "/sys/dayzero-logs/up"])
def test_a_log_dir_the_filesystem_refuses_is_one_line_naming_the_flag(log_dir, tiny_checkpoint, capsys, monkeypatch):
    """As root the parent passes the writable check, and making the directory failed: a bare
    "[Errno 2] No such file or directory: '/proc/dayzero-logs'" (exit 2) or "[Errno 1] Operation not
    permitted" (exit 1), neither naming --log-dir."""
    from dayzero import stack

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", log_dir]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--log-dir" in err and "Errno" not in err, err


def test_up_keeps_a_group_size_and_torchrun_variables_from_its_workers():
    """Each worker's ranks come from `up`'s flags: DAYZERO_TENSOR_PARALLEL or torchrun's variables
    in `up`'s environment overrode --decode-tp 1 (and made vision refuse to start)."""
    from dayzero.service_commands import inherited

    group = {"DAYZERO_TENSOR_PARALLEL": "2", "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    kept = {"PATH": "/bin", "DAYZERO_DEVICE": "cpu", "LOCAL_RANK_HINT": "x"}
    assert inherited({**group, "LOCAL_RANK": "0", **kept}) == kept


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8123"),
        ("0.0.0.0", "http://127.0.0.1:8123"),
        ("::", "http://[::1]:8123"),
        ("::1", "http://[::1]:8123"),
        ("192.0.2.2", "http://192.0.2.2:8123"),
        ("gw.local", "http://gw.local:8123"),
    ],
)
def test_up_waits_for_the_gateway_where_it_binds(host, url):
    """DAYZERO_HOST=<this host's own address>: up probed 127.0.0.1, where nothing listened, and
    printed "waiting: the gateway is starting" for ever while the gateway served."""
    from dayzero.stack import Stack

    assert Stack({}, 8123, None, host=host).url == url


@pytest.mark.parametrize("host", ["nohost.invalid", "203.0.113.7"])
def test_a_host_that_cannot_be_bound_is_not_called_a_port_in_use(host):
    from dayzero.procs import UnbindableHost, free_port, port_in_use

    with pytest.raises(UnbindableHost, match=host):
        port_in_use(host, free_port())


def test_a_free_port_on_an_ipv6_host_is_free():
    import socket

    from dayzero.procs import port_in_use

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert not port_in_use("::1", port)
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", port))
        taken.listen()
        assert port_in_use("::1", port)


def test_a_second_up_on_a_log_dir_in_use_is_refused_naming_the_first(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """Two ``up`` with one --log-dir (./logs by default) appended into the same service logs and redis.log."""
    import os

    from dayzero import stack
    from dayzero.procs import free_port

    logs, seconds = tmp_path / "logs", []
    closed = f"redis://127.0.0.1:{free_port()}/0"  # (a second up let through gives up on it, starting nothing)

    def wait_ready(self, timeout_s, on_wait, on_restart=None):  # the first up, running: a second one starts
        argv = ["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(logs), "--ready-timeout", "1"]
        seconds.append(run_dayzero(*argv, env={**os.environ, **FITS_A_SMALL_SHM, "DAYZERO_REDIS_URL": closed}))
        raise TimeoutError("enough")

    monkeypatch.setattr(stack.Stack, "start", lambda self: None)
    monkeypatch.setattr(stack.Stack, "wait_ready", wait_ready)
    monkeypatch.setenv("DAYZERO_REDIS_URL", closed)
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(logs)]) == 1
    second = seconds[0]
    assert second.returncode == 2 and second.stderr == (
        f"error: --log-dir {logs} is in use by a running dayzero up (pid {os.getpid()}): stop it, or give this "
        "one another --log-dir\n"
    )
    capsys.readouterr()

    def start(self):
        raise stack.StartFailed("started")

    monkeypatch.setattr(stack.Stack, "start", start)  # the first has ended: its lock with it
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(logs)]) == 1
    assert capsys.readouterr().err.endswith("error: started\n")
