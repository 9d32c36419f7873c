"""The service commands of ``dayzero``: ``serve`` (one service in the foreground, as each container
runs it), ``alive`` (its healthcheck) and ``up`` (the whole stack on this machine, in cli_up.py)."""

from __future__ import annotations

import argparse
import os
import signal

from . import cli_args
from .cli_up import add_up_command
from .procs import end_process
from .settings import Settings
from .settings_checks import refused_in_a_group
from .settings_help import settings_help

# the services no --tensor-parallel splits, and why: they refuse the flag; a DAYZERO_TENSOR_PARALLEL
# beside them is the prefill / decode workers' (compose's one environment for every worker)
UNSPLIT = {"gateway": "the gateway runs no model", "vision": "vision runs on one device"}


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """One service in the foreground: the entry point of both ``dayzero up`` and docker compose."""
    from .telemetry import sdk_endpoint_checked

    sdk_endpoint_checked(settings, os.environ)  # (a worker sets its tracer up in Celery's worker_init)
    tp = args.tensor_parallel or (1 if args.service in UNSPLIT else settings.tensor_parallel)
    if tp > 1 and args.service in UNSPLIT:
        raise ValueError(f"--tensor-parallel is for prefill and decode workers; {UNSPLIT[args.service]}")
    if args.service == "gateway":
        _gateway_redis_refusal_checked(settings.redis_url)
        import uvicorn

        from services.gateway.access_log import access_log_config
        from services.gateway.app import make_app
        from services.gateway.deadline import request_read_deadline
        from services.gateway.metrics import error_counter

        app = make_app(settings)
        grace = settings.shutdown_grace_s  # open streams end with an error event well within it
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            # a request sent too slowly gets a 408, a malformed one a 400: counted as the routes' errors
            http=request_read_deadline(settings.max_request_bytes, error_counter(app)),
            log_level="info",
            log_config=access_log_config(),  # its access lines name the requests answered
            timeout_graceful_shutdown=grace,
        )
        return 0
    launch = None  # (vision: one rank, whatever torchrun's variables say)
    if args.service in ("prefill", "decode"):
        from .parallel.launch import launch_from

        launch = launch_from(os.environ, settings.device)  # torchrun's variables: one rank of its group
        if tp > 1 or launch is not None:  # (before the device is looked at: nothing runs)
            refused_in_a_group(args.service, settings, launch.config.world_size if launch else tp)
    settings.require_device()
    if tp > 1 or launch is not None:
        from .checkpoint import check_split
        from .parallel.group import run_group

        check_split(settings.checkpoint_dir(), [tp])  # before any rank starts
        timeout, name = settings.group_timeout_s, args.name
        code = run_group(
            tp, serve_rank, args.service, settings, name, timeout=timeout, launch=launch, device=settings.device
        )
        end_process(code or 0)  # (rank 0's worker's, or a torchrun follower's: None)
    end_process(_run_worker(args.service, settings, args.name))


def _gateway_redis_refusal_checked(url: str) -> None:
    """A ValueError (one line, exit 2) where the gateway's Redis refuses it for good: started alone
    (compose's way) with a wrong password, it served /ready's 503 for ever. A Redis not up yet is
    waited for, as compose starts the two side by side."""
    from .redis_refusals import refusal_at_start, refusal_said

    if refused := refusal_at_start(url):
        raise ValueError(refusal_said(url, refused))


def _run_worker(service: str, settings: Settings, name: str | None, group=None) -> int:
    """The stage's Celery worker in this process (rank 0 of ``group``, when it has one). -> its exit
    code: Celery's (1 when it ended on an error: "Unrecoverable error", a queue Redis refuses for good),
    which ``worker_main`` drops (the process exited 0: a supervisor's restart-on-failure never came)."""
    from celery import signals

    from .serving.worker import worker_argv

    if service == "vision":
        from services.vision.worker import make_worker
    elif service == "prefill":
        from services.prefill.worker import make_worker
    else:
        from services.decode.worker import make_worker
    app = make_worker(settings) if group is None else make_worker(settings, group)
    concurrency = {"vision": 1, "prefill": settings.max_batch, "decode": 2 * settings.max_batch}[service]
    ended: list[object] = []
    signals.worker_shutdown.connect(
        lambda sender=None, **_: ended.append(getattr(sender, "exitcode", None)), weak=False
    )
    app.worker_main(worker_argv(service, concurrency, f"{name or service}@%h"))
    code = ended[-1] if ended else None
    return 0 if code is None else code if isinstance(code, int) else 1  # (None: a cold shutdown; text: 1)


def serve_rank(group, service: str, settings: Settings, name: str | None) -> int | None:
    """One rank of a prefill or decode group: rank 0 is the stage's worker (Celery, Redis, the
    loop); the others load their share of the model and do each step rank 0 tells them. They
    ignore SIGTERM and end with rank 0 (its stop message, or its death: a local rank dies with it from
    its start, ``parallel.group``). -> rank 0's exit code."""
    if group.config.rank == 0:
        return _run_worker(service, settings, name, group)
    import logging

    from .serving.rank_loading import load_ranks

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s] {service} rank {group.config.rank}: %(message)s")
    ranks, _ = load_ranks(settings, group, shared=False)
    logging.getLogger("dayzero.ranks").info("loaded %d of %d; following rank 0", group.config.rank, group.size)
    ranks.follow()


def cmd_alive(args: argparse.Namespace, settings: Settings) -> int:
    """A container's healthcheck: 0 while this host's worker of the stage stamps its liveness, 1 once
    its newest stamp is older than the bound (SIGSTOPped, hung in a step past its bound, a rank
    stopped: Celery's ``inspect ping`` is still answered) or it has none. Redis unreadable: 0 (the
    workers cannot stamp either; ``dayzero up`` counts no staleness then)."""
    import socket

    import redis

    from .redis_clients import unreached
    from .serving.liveness import connect, stamped_ago

    bound, host = args.within or settings.frozen_worker_s, socket.gethostname()
    try:
        age = stamped_ago(connect(settings.redis_url), args.stage)
    except redis.RedisError as exc:
        print(f"cannot read the liveness stamps ({unreached(settings.redis_url, exc)}); not counted against the worker")
        return 0
    if age is None:
        print(f"no {args.stage} worker on {host} has stamped its liveness")
        return 1
    print(f"the {args.stage} worker on {host} stamped its liveness {age:.1f} s ago (bound {bound:g} s)")
    return 0 if not bound or age <= bound else 1


def add_service_commands(sub) -> None:
    """``serve``, ``alive`` and ``up`` on the ``dayzero`` parser's subcommands."""
    with_settings = {"epilog": settings_help(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    serve = sub.add_parser("serve", help="run one service in the foreground (as each container does)", **with_settings)
    serve.add_argument(
        "service",
        choices=["gateway", "vision", "prefill", "decode"],
        metavar="gateway|vision|prefill|decode",
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
    stages = ["vision", "prefill", "decode"]
    alive.add_argument("stage", choices=stages, metavar="|".join(stages), help="the stage whose worker runs here")
    alive.add_argument(
        "--within",
        type=cli_args.positive_float,
        metavar="S",
        help="the bound on its newest stamp's age in seconds (default: DAYZERO_FROZEN_WORKER_S, 30)",
    )
    alive.set_defaults(run=cmd_alive)
    add_up_command(sub, with_settings)
