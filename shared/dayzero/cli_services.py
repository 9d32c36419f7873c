"""The service commands of ``dayzero``: ``serve`` (one service in the foreground, as each container
runs it), ``alive`` (its healthcheck) and ``up`` (the whole stack on this machine, supervised)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from . import cli_args
from .config import ModelConfig
from .settings import Settings
from .settings_help import HELP_WIDTH, settings_help


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """One service in the foreground: the entry point of both ``dayzero up`` and docker compose."""
    if args.service == "gateway":
        import uvicorn

        from services.gateway.app import make_app
        from services.gateway.deadline import request_read_deadline

        app = make_app(settings)
        grace = settings.shutdown_grace_s  # open streams end with an error event well within it
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            http=request_read_deadline(settings.max_request_bytes),  # a request sent too slowly gets a 408
            log_level="info",
            timeout_graceful_shutdown=grace,
        )
        return 0
    settings.require_device()
    tp = args.tensor_parallel or settings.tensor_parallel
    if args.service in ("prefill", "decode"):
        from .parallel.group import run_group
        from .parallel.launch import launch_from

        launch = launch_from(os.environ, settings.device)  # torchrun's variables: one rank of its group
        if tp > 1 or launch is not None:
            if settings.speculative_tokens:  # the followers would need each round's accepted drafts
                raise ValueError("DAYZERO_SPECULATIVE_TOKENS runs on one rank for now: set it to 0 for a group")
            from .checkpoint import check_split

            check_split(settings.checkpoint_dir(), [tp])  # before any rank starts
            timeout, name = settings.group_timeout_s, args.name
            run_group(
                tp, serve_rank, args.service, settings, name, timeout=timeout, launch=launch, device=settings.device
            )
            return 0
    elif tp > 1:
        raise ValueError(f"--tensor-parallel is for prefill and decode workers; {args.service} runs on one device")
    _run_worker(args.service, settings, args.name)
    return 0


def _run_worker(service: str, settings: Settings, name: str | None, group=None) -> None:
    """The stage's Celery worker in this process (rank 0 of ``group``, when it has one)."""
    from .serving.worker import worker_argv

    if service == "vision":
        from services.vision.worker import make_worker
    elif service == "prefill":
        from services.prefill.worker import make_worker
    else:
        from services.decode.worker import make_worker
    app = make_worker(settings) if group is None else make_worker(settings, group)
    concurrency = {"vision": 1, "prefill": settings.max_batch, "decode": 2 * settings.max_batch}[service]
    app.worker_main(worker_argv(service, concurrency, f"{name or service}@%h"))


def serve_rank(group, service: str, settings: Settings, name: str | None) -> None:
    """One rank of a prefill or decode group: rank 0 is the stage's worker (Celery, Redis, the
    loop); the others load their share of the model and do each step rank 0 tells them. They
    ignore SIGTERM and end with rank 0 (its stop message, or its death)."""
    if group.config.rank == 0:
        _run_worker(service, settings, name, group)
        return
    import logging

    from .procs import die_with
    from .serving.runtime import load_ranks

    die_with(os.getppid())
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s] {service} rank {group.config.rank}: %(message)s")
    ranks, _ = load_ranks(settings, group, shared=False)
    logging.getLogger("dayzero.ranks").info("loaded %d of %d; following rank 0", group.config.rank, group.size)
    ranks.follow()


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
    from .checkpoint import check_split
    from .checkpoint_files import checkpoint_directory
    from .stack import Stack, StartFailed
    from .tokenizer import load_codec

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

    planned_pools(settings, config, strict=True)  # pools too small: one line, not a crash loop or 500s
    load_codec(checkpoint)  # a damaged tokenizer: one line here, not a gateway's restart loop
    counts = {"vision": vision, "prefill": args.prefill, "decode": args.decode}
    port = settings.port if args.port is None else args.port
    redis_url = os.environ.get("DAYZERO_REDIS_URL") or os.environ.get("REDIS_URL")  # else an embedded one
    ranks = {"prefill": args.prefill_tp, "decode": args.decode_tp}
    stack = Stack(counts, port, args.log_dir, env, redis_url=redis_url, host=settings.host, ranks=ranks)
    stack.frozen_s = settings.frozen_worker_s
    _stop_on_signals()
    try:
        stack.start()
        print(
            f"starting: redis {stack.redis_url}, gateway, {vision} vision, {args.prefill} prefill"
            f"{_ranks(args.prefill_tp)}, {args.decode} decode{_ranks(args.decode_tp)} (logs in {args.log_dir})",
            file=sys.stderr,
        )
        if stack.metrics_ports:
            ports = ", ".join(f"{name} :{port}" for name, port in stack.metrics_ports.items())
            print(f"worker metrics (DAYZERO_METRICS_PORT, one port each): {ports}", file=sys.stderr)
        show = lambda body: print(f"waiting: {body.get('reason')}", file=sys.stderr)
        restarted = lambda name: print(f"{name} {stack.child(name).why}; restarted", file=sys.stderr)
        stack.wait_ready(args.ready_timeout or None, show, on_restart=restarted)
        print(
            f"ready: send OpenAI-style requests to {stack.url}/v1/chat/completions (model "
            f"{settings.model_name!r}); Ctrl-C stops",
            file=sys.stderr,
        )
        if args.example:
            _example(stack.url, settings.model_name)
        while True:
            for name in stack.supervise():
                restarted(name)
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


def _ranks(n: int) -> str:
    return f" ({n} ranks each)" if n > 1 else ""


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


def cmd_alive(args: argparse.Namespace, settings: Settings) -> int:
    """A container's healthcheck: 0 while this host's worker of the stage stamps its liveness, 1 once
    its newest stamp is older than the bound (SIGSTOPped, hung in a step past its bound, a rank
    stopped: Celery's ``inspect ping`` is still answered) or it has none. Redis unreadable: 0 (the
    workers cannot stamp either; ``dayzero up`` counts no staleness then)."""
    import socket

    import redis

    from .serving.liveness import connect, newest_on

    bound, host = args.within or settings.frozen_worker_s, socket.gethostname()
    try:
        newest = newest_on(connect(settings.redis_url), args.stage)
    except redis.RedisError as exc:
        print(f"cannot read the liveness stamps ({exc}); not counted against the worker")
        return 0
    if newest is None:
        print(f"no {args.stage} worker on {host} has stamped its liveness")
        return 1
    age = time.time() - newest
    print(f"the {args.stage} worker on {host} stamped its liveness {age:.1f} s ago (bound {bound:g} s)")
    return 0 if not bound or age <= bound else 1


def add_service_commands(sub) -> None:
    """``serve``, ``alive`` and ``up`` on the ``dayzero`` parser's subcommands."""
    with_settings = {"epilog": settings_help(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    serve = sub.add_parser("serve", help="run one service in the foreground (as each container does)", **with_settings)
    serve.add_argument(
        "service",
        choices=["gateway", "vision", "prefill", "decode"],
        help="the service: the HTTP gateway, or the vision, prefill or decode stage's worker",
    )
    serve.add_argument("--name", help="worker name (default: the service name)")
    serve.add_argument(
        "--tensor-parallel",
        type=cli_args.positive,
        metavar="N",
        help="prefill / decode: one worker of N ranks, the model split over them, N local ranks (gloo on CPU, "
        "NCCL on cuda:0..N-1) or, under torchrun, this process as one rank of its group (default: "
        "DAYZERO_TENSOR_PARALLEL, 1)",
    )
    serve.set_defaults(run=cmd_serve)

    alive = sub.add_parser(
        "alive",
        help="exit 1 when this host's worker of a stage stamped no liveness lately (a healthcheck)",
        description="Exit 0 while this host's worker of the stage stamps its liveness in Redis (DAYZERO_REDIS_URL), "
        "1 when its newest stamp is older than --within or it has none: SIGSTOPped, hung in a step past its bound, "
        "a rank stopped (its Celery still answers a ping). Exit 0 while Redis cannot be read: no worker can stamp "
        "then, so a wrong DAYZERO_REDIS_URL passes too (compose's healthcheck also pings Celery).",
    )
    alive.add_argument("stage", choices=["vision", "prefill", "decode"])
    alive.add_argument(
        "--within",
        type=cli_args.positive_float,
        metavar="S",
        help="the bound on its newest stamp's age in seconds (default: DAYZERO_FROZEN_WORKER_S, 30)",
    )
    alive.set_defaults(run=cmd_alive)

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
    up.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (default: the built-in trained model)")
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
    up.add_argument("--port", type=cli_args.port, help="gateway port, 1-65535 (default: DAYZERO_PORT or 8000)")
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
