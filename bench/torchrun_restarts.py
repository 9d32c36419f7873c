"""A decode group across two hosts under ``torchrun --max-restarts``: one rank SIGKILLed, does the
group come back and serve?

The stack (Redis, gateway, one prefill) in this network namespace; ``serve decode --tensor-parallel
2`` under torchrun with rank 0 here and rank 1 in a namespace of its own (a veth between them, gloo
over it: tests/parallel/test_hosts.py's set-up). Once a completion is served, the worker process of
``--kill`` rank is SIGKILLed (``--fault rank``), or that host's torchrun with its rank, and its
torchrun is started again alone (``--fault torchrun``: a rebooted host, a restarted pod; it counts
its attempts from 0 again); completions are then asked for until one is served (each compared with
the one-rank engine's). Reports when each rank started again (torchrun's TORCHELASTIC_RESTART_COUNT,
from the ranks' logs), how long after the kill the first completion was served, whether both
torchruns still run, and how the group ends on SIGTERM with the stack's Redis gone (``--stop``: every
torchrun, as docs/parallel.md says, host 0's alone, or rank 0's process): when each rank, torchrun
and other child exited, and the logs' time-stamped lines after the SIGTERM. Needs root (``ip netns``). Run:
``python bench/torchrun_restarts.py [--kill 1] [--fault rank|torchrun] [--max-restarts 1] [--rdzv static|c10d]
[--stop torchrun|torchruns|rank]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from demo_stack import scratch, stack_on
from options import bench_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' namespace helpers

from dayzero.demo import write_demo_checkpoint  # noqa: E402
from dayzero.procs import free_port  # noqa: E402
from tests.parallel.test_hosts import Hosts, _stop, meeting  # noqa: E402
from tests.services.conftest import SETTINGS_ENV, prompt_ids  # noqa: E402
from tests.services.in_process import engine_completer  # noqa: E402

SERVE = ["-m", "dayzero.cli", "serve", "decode", "--tensor-parallel", "2", "--name", "decode0"]


def torchrun(node: int, port: int, rdzv: str, restarts: int, logs: Path) -> list[str]:
    """torchrun for ``node`` of 2, static or c10d rendezvous (test_hosts' ``meeting``)."""
    head = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    meet = meeting(node, port, rdzv)
    return [*head, *meet, "--max-restarts", str(restarts), "--log-dir", str(logs / f"torchrun{node}"), *SERVE]


def worker_of(agent: subprocess.Popen) -> psutil.Process:
    """The rank torchrun's agent runs (its child running dayzero.cli; ``ip netns exec`` execs torchrun)."""
    for child in psutil.Process(agent.pid).children():
        if "dayzero.cli" in child.cmdline():
            return child
    raise RuntimeError("torchrun runs no rank")


def worker_or_none(agent: subprocess.Popen) -> psutil.Process | None:
    with contextlib.suppress(RuntimeError, psutil.NoSuchProcess):
        return worker_of(agent)
    return None


def exits(
    watched: dict[str, psutil.Process], agents: list[subprocess.Popen], since: float, deadline: float
) -> list[tuple[str, float]]:
    """(name, seconds after ``since``) as each watched process exits (reaped or a zombie), in order."""
    ended: dict[str, float] = {}
    while len(ended) < len(watched) and time.monotonic() - since < deadline:
        for agent in agents:
            agent.poll()  # reaps an exited torchrun
        for name, proc in watched.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                if name not in ended and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    continue
            ended.setdefault(name, time.monotonic() - since)
        time.sleep(0.02)
    return sorted(ended.items(), key=lambda item: item[1])


STAMPS = (  # Celery's and dayzero's log lines, torchrun's (glog: I/W/E MMDD HH:MM:SS.ffffff)
    (re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"), "%Y-%m-%d %H:%M:%S,%f"),
    (re.compile(r"^[IWE](\d{4} \d\d:\d\d:\d\d\.\d{6})"), "%m%d %H:%M:%S.%f"),
)


def stamped_after(log: Path, offset: int, since: float) -> list[str]:
    """The log's lines written after byte ``offset`` that carry a time stamp, each with its seconds after ``since``."""
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    shown, year = [], datetime.datetime.fromtimestamp(since).year
    for line in text.splitlines():
        for pattern, form in STAMPS:
            if found := pattern.search(line):
                stamp = found.group(1) if "%Y" in form else f"{year}{found.group(1)}"
                at = datetime.datetime.strptime(stamp, form if "%Y" in form else f"%Y{form}").timestamp()
                shown.append(f"    {at - since:6.2f}  {line[:180]}")
                break
    return shown


def complete(url: str, i: int, timeout: float) -> tuple[str, str]:
    """(outcome, text) of one greedy completion: "served", or the HTTP status / error."""
    body = {"model": "dayzero-demo", "prompt": prompt_ids(i), "max_tokens": 8 + i, "temperature": 0}
    try:
        r = httpx.post(f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=timeout)
    except httpx.HTTPError as exc:
        return type(exc).__name__, ""
    return ("served", r.json()["choices"][0]["text"]) if r.status_code == 200 else (f"HTTP {r.status_code}", "")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--kill", type=int, default=1, choices=(0, 1), help="the rank (and host) SIGKILLed")
    parser.add_argument(
        "--fault",
        default="rank",
        choices=("rank", "torchrun"),
        help="kill the rank, or its torchrun too, started again",
    )
    parser.add_argument("--max-restarts", type=int, default=1)
    parser.add_argument("--rdzv", default="static", choices=("static", "c10d"))
    parser.add_argument("--wait", type=float, default=240.0, help="seconds after the kill to keep asking")
    parser.add_argument(
        "--stop",
        default="torchruns",
        choices=("torchruns", "torchrun", "rank"),
        help="the end, Redis gone: SIGTERM to both hosts' torchruns, to host 0's alone, or to rank 0 itself",
    )
    args = parser.parse_args()
    with scratch() as tmp:
        run(tmp, args)


def run(tmp: Path, args: argparse.Namespace) -> None:
    checkpoint = write_demo_checkpoint(tmp / "float")
    reference = engine_completer(checkpoint, "cpu")
    hosts = Hosts(f"dzr{os.getpid() % 10000}", root=True)
    hosts.add()
    stack = stack_on(checkpoint, {"vision": 0, "prefill": 1, "decode": 0}, tmp / "logs", SETTINGS_ENV)
    agents: list[subprocess.Popen] = []
    logs = [tmp / "logs" / f"decode-node{node}.log" for node in (0, 1)]
    try:
        hosts.connect()
        stack.start()
        port = free_port()

        def start(node: int) -> subprocess.Popen:
            env = {**stack.env, "GLOO_SOCKET_IFNAME": hosts.links[node], "PYTHONUNBUFFERED": "1"}
            argv = torchrun(node, port, args.rdzv, args.max_restarts, tmp / "logs")
            return hosts.start(node, argv, env, stdout=logs[node].open("a"), stderr=subprocess.STDOUT)

        agents += [start(0), start(1)]
        started = time.monotonic()
        stack.wait_ready(timeout_s=240)
        print(f"group ready {time.monotonic() - started:.1f} s after torchrun started")
        outcome, text = complete(stack.url, 0, 120)
        print(f"before the kill: {outcome}, equal to one rank's: {text == reference(prompt_ids(0), 8)}")
        victim = worker_of(agents[args.kill])
        if args.fault == "rank":
            victim.send_signal(signal.SIGKILL)
        else:
            _stop([agents[args.kill]])  # torchrun and its rank, SIGKILLed (reaped)
        killed = time.monotonic()
        print(f"SIGKILLed rank {args.kill} (pid {victim.pid}){' and its torchrun' if args.fault != 'rank' else ''}")
        if args.fault == "torchrun":
            agents[args.kill] = start(args.kill)
            print(f"started host {args.kill}'s torchrun again ({time.monotonic() - killed:.1f} s after the kill)")
        i, outcome = 0, ""
        while outcome != "served" and time.monotonic() - killed < args.wait:
            i += 1
            outcome, text = complete(stack.url, i, max(1.0, args.wait - (time.monotonic() - killed)))
            ago = time.monotonic() - killed
            same = text == reference(prompt_ids(i), 8 + i) if outcome == "served" else None
            print(f"  request {i}: {outcome} {ago:.1f} s after the kill (equal to one rank's: {same})")
            if outcome != "served":
                time.sleep(1.0)
        print(f"torchrun exit codes now (None: running): {[agent.poll() for agent in agents]}")
    finally:
        stack.stop()
        watched = {f"rank {node}": worker for node, worker in enumerate(map(worker_or_none, agents)) if worker}
        watched |= {f"host {node}'s torchrun": psutil.Process(agent.pid) for node, agent in enumerate(agents)}
        watched |= {  # anything else the agents or the ranks started
            f"host {node}'s pid {proc.pid} ({' '.join(proc.cmdline())[:60]})": proc
            for node, agent in enumerate(agents)
            for proc in psutil.Process(agent.pid).children(recursive=True)
            if proc not in watched.values()
        }
        sizes = [log.stat().st_size if log.exists() else 0 for log in logs]
        stop_started, stop_wall = time.monotonic(), time.time()
        stopped = {"torchrun": agents[:1], "torchruns": agents, "rank": []}[args.stop]
        for agent in stopped:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        if args.stop == "rank" and "rank 0" in watched:
            watched["rank 0"].send_signal(signal.SIGTERM)
        ended = exits(watched, agents, stop_started, deadline=60)
        codes = [agent.poll() for agent in agents]
        whom = {"torchrun": "host 0's torchrun", "torchruns": "both torchruns", "rank": "rank 0"}[args.stop]
        print(f"after SIGTERM to {whom}: exit codes {codes} in {time.monotonic() - stop_started:.1f} s")
        print(*(f"  {at:5.2f} s  {name} exited" for name, at in ended), sep="\n")
        for node in (0, 1):
            print(f"  node {node}'s lines after the SIGTERM (s since it, by the line's own clock):")
            print(*stamped_after(logs[node], sizes[node], stop_wall), sep="\n")
        _stop(agents)
        hosts.delete()
        for node in (0, 1):
            lines = logs[node].read_text().splitlines()
            shown = [line for line in lines if "failed (exitcode" in line or "group failed" in line]
            shown += [line for line in lines if "Restarting" in line or "rendezvous" in line.lower()][:6]
            shown += [line for line in lines[-3:] if line not in shown]  # how it ended (a traceback's last lines)
            print(f"node {node} log ({len(lines)} lines):", *(f"    {line[:220]}" for line in shown), sep="\n")


if __name__ == "__main__":
    main()
