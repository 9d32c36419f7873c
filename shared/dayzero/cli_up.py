"""``dayzero up``: Redis, the gateway and every worker on this machine, supervised, until SIGINT or
SIGTERM stops them in order."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from . import cli_args
from .config import ModelConfig
from .redis_urls import without_password
from .settings import Settings
from .settings_checks import refused_in_a_group
from .settings_help import HELP_WIDTH


class _Stop(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the supervisor (before the stack starts: SIGINT is main's Ctrl-C,
    exit 130; SIGTERM exit 143, its own shell code)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_STOPS = (signal.SIGINT, signal.SIGTERM)


def _ignore_stops() -> None:
    """The ordered stop is not interrupted: a second Ctrl-C (or one after a failed start) left the
    children it had not reached running, each in a session of its own."""
    for sig in _STOPS:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Handle SIGINT and SIGTERM explicitly (a background job inherits SIGINT ignored), and give the
    caller its own handlers back (a test's process kept up's, which ignored its second Ctrl-C)."""

    def stop(signum: int, _frame: object) -> None:
        _ignore_stops()
        raise _Stop(signum)

    previous = {sig: signal.getsignal(sig) for sig in _STOPS}
    for sig in _STOPS:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    with _stop_on_signals():  # first: a background job's SIGINT (inherited ignored) was lost during the checks
        try:
            return _up(args, settings)
        except _Stop as stop:  # before the stack started (a SIGTERM was "interrupted", exit 130)
            if stop.signum != signal.SIGTERM:
                raise
            print("terminated", file=sys.stderr)
            return 128 + signal.SIGTERM


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from .checkpoint import check_split
    from .checkpoint_files import checkpoint_directory
    from .device_shares import kv_fractions
    from .redis_watch import RedisWatch
    from .stack import Stack, StartFailed
    from .tokenizer import load_codec

    for service, ranks in (("prefill", args.prefill_tp), ("decode", args.decode_tp)):
        if ranks > 1:  # its child's serve would refuse, restarted until up gave up
            refused_in_a_group(service, settings, ranks)
    settings.require_device()
    env = {}
    if args.checkpoint:
        env["DAYZERO_CHECKPOINT"] = str(Path(args.checkpoint).resolve())
    checkpoint = checkpoint_directory(args.checkpoint or settings.checkpoint_dir())  # (written once here)
    config = ModelConfig.from_file(checkpoint)  # (a missing or broken one ends here, not in every child)
    sees = "vision_config" in config.raw
    vision = int(sees) if args.vision is None else args.vision
    if sees and not vision:
        raise ValueError(f"{checkpoint} has a vision tower: serving it needs --vision 1 or more")
    if vision and not sees:
        raise ValueError(f"{checkpoint} has no vision tower: --vision must be 0")
    # what the workers could not load ends here, not in a restart loop
    check_split(checkpoint, (args.prefill_tp, args.decode_tp), config)
    from .serving.budget import planned_pools
    from .serving.pool_room import stack_pools_refused

    pools, budget = planned_pools(settings, config, strict=True)  # pools too small: one line, not a crash loop or 500s
    counts = {"vision": vision, "prefill": args.prefill, "decode": args.decode}
    ranks = {"prefill": args.prefill_tp, "decode": args.decode_tp}
    if refused := stack_pools_refused(settings, pools, budget, counts, ranks):  # not each worker, once loaded
        raise ValueError(refused)
    shares = kv_fractions(settings, counts, ranks)  # workers sharing a GPU: each its share of it
    load_codec(checkpoint)  # a damaged tokenizer: one line here, not a gateway's restart loop
    _make_log_dir(args.log_dir)
    claim = _claim_log_dir(args.log_dir)  # held until up returns (the children do not inherit it)
    port = settings.port if args.port is None else args.port
    redis_url = os.environ.get("DAYZERO_REDIS_URL") or os.environ.get("REDIS_URL")  # else an embedded one
    stack = Stack(counts, port, args.log_dir, env, redis_url, settings.host, ranks, service_env=shares)
    stack.frozen_s, stack.start_exits = settings.frozen_worker_s, settings.start_exits
    stack.redis_answer_within_s = settings.redis_answer_within_s
    watch = None
    try:
        stack.start()
        print(
            f"starting: redis {without_password(stack.redis_url)}, gateway, {vision} vision, {args.prefill} prefill"
            f"{_ranks(args.prefill_tp)}, {args.decode} decode{_ranks(args.decode_tp)} (logs in {args.log_dir})",
            file=sys.stderr,
        )
        if stack.metrics_ports:
            ports = ", ".join(f"{name} :{port}" for name, port in stack.metrics_ports.items())
            print(f"worker metrics (DAYZERO_METRICS_PORT, one port each): {ports}", file=sys.stderr)
        began = time.monotonic()  # each waiting line says how long (a wait without --ready-timeout has no end)
        show = lambda body: print(f"waiting ({time.monotonic() - began:.0f} s): {body.get('reason')}", file=sys.stderr)
        restarted = lambda name: print(stack.child(name).restart_said(), file=sys.stderr)
        stack.wait_ready(args.ready_timeout or None, show, on_restart=restarted)
        print(
            f"ready: send OpenAI-style requests to {stack.url}/v1/chat/completions (model "
            f"{settings.model_name!r}); Ctrl-C stops",
            file=sys.stderr,
        )
        if args.example:
            _example(stack.url, settings)
        watch = RedisWatch(redis_url, lambda line: print(line, file=sys.stderr)) if redis_url else None

        def watched() -> bool:  # (never done: up supervises until a stop)
            if watch is not None:
                watch.check()
            return False

        stack.supervised_until(watched, None, restarted)
    except _Stop:
        print("stopping: gateway, then workers, then redis", file=sys.stderr)
    except (StartFailed, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        _ignore_stops()
        if watch is not None:  # (its client's connection was left open)
            watch.close()
        killed = stack.stop()
        claim.close()
        if killed:
            print(f"stopped; killed {', '.join(killed)} (still running after SIGTERM)", file=sys.stderr)
    return 0


def _make_log_dir(path: Path) -> None:
    """``--log-dir``, made now: a directory the filesystem refuses though its parent looks writable
    (``/proc/x``, ``/sys/x`` as root) was a bare OS error naming no flag."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--log-dir {path} cannot be made: {exc.strerror}") from None


def _claim_log_dir(path: Path) -> TextIO:
    """An exclusive lock on ``path``/up.lock, which names this up's pid: a second up on the same
    --log-dir appended to the first's service logs and redis.log. Released when the file closes
    or this process ends, however it ends."""
    claim = (path / "up.lock").open("a+")
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        claim.seek(0)
        holder = claim.read().strip() or "unknown"
        claim.close()
        raise ValueError(
            f"--log-dir {path} is in use by a running dayzero up (pid {holder}): stop it, or give this one "
            "another --log-dir"
        ) from None
    except OSError as exc:  # a filesystem without flock (NFSv3 without lockd: ENOLCK): the check, not up, is lost
        print(
            f"warning: --log-dir {path} cannot be locked ({exc.strerror}): a second up on it is not refused",
            file=sys.stderr,
        )
    claim.truncate(0)
    claim.write(f"{os.getpid()}\n")
    claim.flush()
    return claim


def _ranks(n: int) -> str:
    return f" ({n} ranks each)" if n > 1 else ""


def _example(url: str, settings: Settings) -> None:
    """One streamed request, sent as a client would (with the first API key when keys are asked for).
    A refusal or an error is one line: a 401 under DAYZERO_API_KEYS printed nothing, an error event
    a KeyError's traceback."""
    import httpx

    body = {
        "model": settings.model_name,
        "stream": True,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "The quick brown fox"}],
    }
    headers = {"authorization": f"Bearer {settings.api_keys[0]}"} if settings.api_keys else {}
    print("example request: 'The quick brown fox' ->", file=sys.stderr)
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
            if response.status_code != 200:
                print(
                    f"example request refused: HTTP {response.status_code} {response.read().decode()}", file=sys.stderr
                )
                return
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        print(f"\nexample request failed: {chunk['error'].get('message')}", file=sys.stderr)
                        return
                    sys.stdout.write(chunk["choices"][0]["delta"].get("content") or "")
                    sys.stdout.flush()
    except httpx.HTTPError as exc:  # the stack serves on: the example only shows it
        print(f"\nexample request failed: {exc!r}", file=sys.stderr)
        return
    print()


def add_up_command(sub, with_settings: dict) -> None:
    """``up`` on the ``dayzero`` parser's subcommands."""
    up = sub.add_parser(
        "up",
        help="run Redis, the gateway and the workers on this machine",
        description=textwrap.fill(  # printed as is, as the settings' epilog is
            "Run Redis (DAYZERO_REDIS_URL or REDIS_URL when set, else an embedded one), the gateway and the "
            "workers on this machine, supervised; with DAYZERO_METRICS_PORT=P each worker serves its own /metrics "
            "on P, P+1, ... in the order they are listed at start.",
            HELP_WIDTH,
        ),
        **with_settings,
    )
    up.add_argument("--checkpoint", metavar="DIR", help=cli_args.CHECKPOINT_HELP)
    up.add_argument("--prefill", type=cli_args.positive, default=1, metavar="N", help="prefill workers (default 1)")
    up.add_argument("--decode", type=cli_args.positive, default=1, metavar="N", help="decode workers (default 1)")
    up.add_argument(
        "--prefill-tp", type=cli_args.positive, default=1, metavar="N", help="ranks per prefill worker (default 1)"
    )
    up.add_argument(
        "--decode-tp", type=cli_args.positive, default=1, metavar="N", help="ranks per decode worker (default 1)"
    )
    vision = "vision workers (default: 1 if the checkpoint has a vision tower, else 0)"
    up.add_argument("--vision", type=cli_args.count, metavar="N", help=vision)
    up.add_argument(
        "--port", type=cli_args.port, metavar="1-65535", help="gateway port, 1-65535 (default: DAYZERO_PORT or 8000)"
    )
    logs = "where each service writes its log (default ./logs)"
    up.add_argument("--log-dir", type=cli_args.out_dir, default="logs", metavar="DIR", help=logs)
    up.add_argument("--example", action="store_true", help="once ready, stream one example request")
    up.add_argument(
        "--ready-timeout",
        type=cli_args.non_negative_float,
        default=0.0,
        metavar="S",
        help="give up if not ready after this many seconds (default 0: wait as long as it takes)",
    )
    up.set_defaults(run=cmd_up)
