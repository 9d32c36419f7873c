"""The service commands of ``dayzero``: ``serve`` (one service in the foreground, as each container
runs it) and ``up`` (the whole stack on this machine, supervised)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from .settings import Settings


def cmd_serve(args: argparse.ArgumentParser, settings: Settings) -> int:
    """One service in the foreground: the entry point of both ``dayzero up`` and docker compose."""
    if args.service == "gateway":
        import uvicorn

        from services.gateway.app import make_app

        app = make_app(settings)
        grace = settings.shutdown_grace_s  # open streams end with an error event well within it
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", timeout_graceful_shutdown=grace)
        return 0
    from .serving.worker import worker_argv

    if args.service == "vision":
        from services.vision.worker import make_worker
    elif args.service == "prefill":
        from services.prefill.worker import make_worker
    else:
        from services.decode.worker import make_worker
    app = make_worker(settings)
    concurrency = {"vision": 1, "prefill": settings.max_batch, "decode": 2 * settings.max_batch}[args.service]
    app.worker_main(worker_argv(args.service, concurrency, f"{args.name or args.service}@%h"))
    return 0


class _Stop(Exception):
    """SIGINT or SIGTERM reached the supervisor."""


def _stop_on_signals() -> None:
    """Handle SIGINT and SIGTERM explicitly: a background job inherits SIGINT ignored."""

    def stop(*_: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):  # once: the ordered stop is not interrupted
            signal.signal(sig, signal.SIG_IGN)
        raise _Stop

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    import os

    from .stack import Stack, StartFailed

    env = {}
    if args.checkpoint:
        env["DAYZERO_CHECKPOINT"] = str(Path(args.checkpoint).resolve())
    else:
        settings.checkpoint_dir()  # the built-in one, written once before the children start
    counts = {"vision": args.vision, "prefill": args.prefill, "decode": args.decode}
    port, redis_url = args.port or settings.port, os.environ.get("REDIS_URL")
    stack = Stack(counts, port, Path(args.log_dir), env, redis_url=redis_url, host=settings.host)
    _stop_on_signals()
    try:
        stack.start()
        print(
            f"starting: redis {stack.redis_url}, gateway, {args.vision} vision, {args.prefill} prefill, "
            f"{args.decode} decode (logs in {args.log_dir})",
            file=sys.stderr,
        )
        show = lambda body: print(f"waiting: {body.get('reason')}", file=sys.stderr)
        stack.wait_ready(args.ready_timeout or None, show)
        print(
            f"ready: send OpenAI-style requests to {stack.url}/v1/chat/completions (model "
            f"{settings.model_name!r}); Ctrl-C stops",
            file=sys.stderr,
        )
        if args.example:
            _example(stack.url, settings.model_name)
        while True:
            for name in stack.supervise():
                print(f"{name} exited; restarted", file=sys.stderr)
            time.sleep(0.5)
    except _Stop:
        print("stopping: gateway, then workers, then redis", file=sys.stderr)
    except (StartFailed, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        killed = stack.stop()
        if killed:
            print(f"stopped; killed {', '.join(killed)} (still running after SIGTERM)", file=sys.stderr)
    return 0


def _example(url: str, model: str) -> None:
    import httpx

    body = {
        "model": model,
        "stream": True,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "The quick brown fox"}],
    }
    print("example request: 'The quick brown fox' ->", file=sys.stderr)
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                sys.stdout.write(delta.get("content", ""))
                sys.stdout.flush()
    print()
