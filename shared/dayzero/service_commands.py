"""What ``dayzero up`` runs for each service: its ``dayzero`` arguments (docker compose runs the
same) and the environment it inherits from ``up``."""

from __future__ import annotations

SERVICES = ("gateway", "vision", "prefill", "decode")


def service_argv(service: str, ranks: int = 1) -> list[str]:
    """The arguments of ``dayzero`` that run one service (a worker of ``ranks`` ranks);
    docker-compose.yml runs the same."""
    return ["serve", service, *(["--tensor-parallel", str(ranks)] if ranks > 1 else [])]


def inherited(environ: dict[str, str]) -> dict[str, str]:
    """The environment the children get from ``up``'s, less a group size and torchrun's variables:
    each worker's ranks are its own (``ranks``), else every prefill and decode child would be a
    rank of one group."""
    from .parallel.launch import VARIABLES as RENDEZVOUS

    return {k: v for k, v in environ.items() if k not in ("DAYZERO_TENSOR_PARALLEL", *RENDEZVOUS)}
