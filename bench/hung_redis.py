"""How a stack comes through a Redis that hangs rather than refuses: ``frozen`` (redis-server SIGSTOPped,
then SIGCONTed: its connections and its listen backlog kept, no reply meanwhile) or ``unreachable``
(redis-server in a network namespace whose end of the veth pair goes down: every packet dropped, then
the link up again; needs root and ``ip netns``) or ``partitioned`` (the same namespace, both links left
up and every packet dropped both ways by a ``blackhole`` qdisc on each end; root, ``ip``, ``tc``). For
each fault and each of ``--outages`` seconds, on a stack of 1 vision, 1 prefill and 1 decode worker on
the demo checkpoint (with its vision tower, leases of 1 s): a long stream in flight as Redis goes;
``/ready`` asked every 0.5 s meanwhile; from Redis back, a text request, then one with an image, sent
again until answered 200 (each first 200's seconds after Redis back); how the stream ended and when, and
how many tokens its request generated past the last one the client got (its stream's last entry, once
the request ended, or GIVE_UP_S after Redis's return) and how it ended (its ``done`` mark); each
worker's log records from the fault on. ``--redis-rto-max-ms``: the unreachable (or partitioned) Redis's
TCP retransmissions at most this far apart (the Redis host's ``net.ipv4.tcp_rto_max_ms``, Linux 6.15
on): its replies sent during the cut (a worker's queue read, 1 s blocks) otherwise come back with TCP's
backoff, up to ~3 s after a 5 s cut.
Run: ``sudo .venv/bin/python bench/hung_redis.py [--faults frozen,unreachable,partitioned] [--outages 5,30]``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from statistics import median

import httpx
import redis
from demo_stack import QUICK_LEASES, running, scratch, stack_on
from options import bench_parser
from outage_log_lines import records
from PIL import Image

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port, start_redis
from dayzero.serving.keys import key

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services.unreachable import netns_usable, partition_usable, unreachable_redis  # noqa: E402

MODEL = "dayzero-demo"
LONG = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 400, "ignore_eos": True, "stream": True}
TEXT = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4}
GIVE_UP_S = 120.0  # a request not answered 200 this long after Redis is back: "never"
WORKERS = ("vision0", "prefill0", "decode0")
RTO_MAX_MS = (1000, 120_000)  # the sysctl's range (Linux's TCP_RTO_MAX_MIN_SEC .. TCP_RTO_MAX_SEC)
# what each fault made of the network needs here, and its check (frozen: nothing)
NEEDS = {"unreachable": ("root and ip (iproute2)", netns_usable), "partitioned": ("root, ip and tc", partition_usable)}


def image_body() -> dict:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), (120, 30, 200)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}


class FrozenRedis:
    """A redis-server of the bench's own, ``cut``: SIGSTOPped (its connections kept, nothing answered)."""

    def __init__(self, server: subprocess.Popen, port: int) -> None:
        self.server, self.url = server, f"redis://127.0.0.1:{port}/0"

    def cut(self) -> None:
        self.server.send_signal(signal.SIGSTOP)

    def mend(self) -> None:
        self.server.send_signal(signal.SIGCONT)


@contextmanager
def frozen_redis(log: Path) -> Iterator[FrozenRedis]:
    port = free_port()
    server = start_redis(port, log)
    try:
        yield FrozenRedis(server, port)
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait()


class LongStream:
    """``LONG`` streamed on a thread: its tokens, how it ended (``finish``, ``error: <code>``, ``cut``),
    its request's id and the last event id it got."""

    def __init__(self, url: str) -> None:
        self.tokens, self.end, self.ended_at, self.request_id, self.last_id = 0, "", None, "", "0-0"
        self.decoding = threading.Event()
        threading.Thread(target=self._read, args=(url,), daemon=True).start()

    def _read(self, url: str) -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=GIVE_UP_S * 3) as response:
                self.request_id = response.headers["x-request-id"]
                for line in response.iter_lines():
                    if line.startswith("id: "):
                        self.last_id = line[4:]
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.end = f"error: {event['error'].get('code')}"
                    elif event["choices"][0].get("finish_reason"):
                        self.end = event["choices"][0]["finish_reason"]
                    else:
                        self.tokens += 1
                        if self.tokens == 10:
                            self.decoding.set()
        except httpx.HTTPError as exc:
            self.end = f"cut ({type(exc).__name__})"
        self.ended_at = time.monotonic()


def ready_during(url: str, stop: threading.Event, seen: list[str]) -> None:
    while not stop.is_set():
        try:
            seen.append(str(httpx.get(f"{url}/ready", timeout=2).status_code))
        except httpx.HTTPError:
            seen.append("hung")
        stop.wait(0.5)


def served_after(url: str, path: str, body: dict, back: float) -> float | None:
    """Seconds from ``back`` to the first 200 of ``body`` sent again and again; None: not in GIVE_UP_S."""
    while time.monotonic() - back < GIVE_UP_S:
        try:
            if httpx.post(f"{url}{path}", json=body, timeout=GIVE_UP_S).status_code == 200:
                return time.monotonic() - back
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return None


def one_outage(stack, fault: FrozenRedis, outage_s: float, logs: Path) -> dict:
    stream = LongStream(stack.url)
    assert stream.decoding.wait(120), "the long stream did not start"
    marks = {name: len((logs / f"{name}.log").read_text()) for name in WORKERS}
    stop, seen = threading.Event(), []
    poll = threading.Thread(target=ready_during, args=(stack.url, stop, seen), daemon=True)
    fault.cut()
    poll.start()
    time.sleep(outage_s)
    fault.mend()
    back = time.monotonic()
    stop.set()
    poll.join()
    text = served_after(stack.url, "/v1/completions", TEXT, back)
    image = served_after(stack.url, "/v1/chat/completions", image_body(), back)
    while stream.ended_at is None and time.monotonic() - back < GIVE_UP_S:
        time.sleep(0.5)
    after = generated_after(fault.url, stream, back)
    time.sleep(2.0)  # (the lines of the recovery written)
    lines = {n: len(records((logs / f"{n}.log").read_text()[marks[n] :])) for n in WORKERS}
    ended = "running" if stream.ended_at is None else f"{stream.end} {stream.ended_at - back:+.1f}"
    ready = ",".join(f"{s}x{seen.count(s)}" for s in sorted(set(seen)))
    got = {"text": text, "image": image, "stream": ended, "tokens": stream.tokens, "ready": ready, "lines": lines}
    return {**got, "after": after}


def generated_after(url: str, stream: LongStream, back: float) -> str:
    """Tokens the stream's request generated after the last one its client got, and its end (its
    ``done`` mark), once it ended (or "running" GIVE_UP_S after Redis's return)."""
    r, rid = redis.Redis.from_url(url), stream.request_id
    while not (done := r.get(key("done", rid))) and time.monotonic() - back < GIVE_UP_S:
        time.sleep(0.2)
    last = r.xrevrange(key("tokens", rid), count=1)
    generated = int(last[0][1][b"i"]) + (int(last[0][1][b"t"]) >= 0) if last else 0  # (an end without a token: -1)
    got = int(stream.last_id.split("-")[0])  # (entry n-0 holds the nth token)
    return f"{generated - got} {done.decode() if done else 'running'}"


HEADS = (
    "fault",
    "s",
    "text s",
    "image s",
    "stream: end, s after Redis back",
    "tokens after it, end",
    "/ready meanwhile",
    "log records",
)
WIDTHS = (11, 3, 7, 8, 34, 20, 22, 0)


def row(*cells: object) -> str:
    return " ".join(f"{cell:>{width}}" if width else str(cell) for cell, width in zip(cells, WIDTHS, strict=True))


def outages_on(stack, fault: FrozenRedis, name: str, outages: list[float], logs: Path) -> dict[float, list]:
    """Each of ``outages`` in turn on ``stack``: its row printed. -> per outage, its (text, image) seconds."""
    served: dict[float, list] = {}
    for outage_s in outages:
        got = one_outage(stack, fault, outage_s, logs)
        said = [f"{got[k]:.1f}" if got[k] is not None else "never" for k in ("text", "image")]
        lines = " ".join(f"{n}={c}" for n, c in got["lines"].items())
        print(row(name, f"{outage_s:.0f}", *said, got["stream"], got["after"], got["ready"], lines), flush=True)
        served.setdefault(outage_s, []).append((got["text"], got["image"]))
        stack.wait_ready(timeout_s=GIVE_UP_S)
    return served


def rto_max_ms(text: str) -> int:
    """``--redis-rto-max-ms``: what the kernel's sysctl takes (1000 to 120000; else the bench ended,
    its namespace made, in a traceback of ``ip netns exec ... sysctl``)."""
    if not text.isdigit() or not RTO_MAX_MS[0] <= int(text) <= RTO_MAX_MS[1]:
        raise argparse.ArgumentTypeError(
            f"net.ipv4.tcp_rto_max_ms takes {RTO_MAX_MS[0]} to {RTO_MAX_MS[1]}, not {text}"
        )
    return int(text)


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--faults", default="frozen,unreachable", help="comma-separated: frozen, unreachable, partitioned")
    p.add_argument("--outages", default="5,30", help="seconds Redis hangs, comma-separated")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--keep", default="", help="a folder to keep the stack's logs in")
    p.add_argument(
        "--redis-rto-max-ms", type=rto_max_ms, default=None, help="unreachable: Redis's net.ipv4.tcp_rto_max_ms"
    )
    args = p.parse_args()
    capped = partial(unreachable_redis, rto_max_ms=args.redis_rto_max_ms)
    faults = {"frozen": frozen_redis, "unreachable": capped, "partitioned": partial(capped, partitioned=True)}
    for name in args.faults.split(","):  # (else a missing tool failed mid-run, a stack started, in a traceback)
        if name not in faults:
            p.error(f"--faults: {name!r} is none of {', '.join(faults)}")
        if name in NEEDS and not NEEDS[name][1]():
            p.error(
                f"--faults {name} needs {NEEDS[name][0]} on PATH (sudo .venv/bin/python ...); --faults frozen does not"
            )
    outages = [float(s) for s in args.outages.split(",")] * args.rounds
    print(row(*HEADS))
    with scratch(args.keep) as folder:
        checkpoint = write_demo_checkpoint(folder / "demo", vision=True)
        for name in args.faults.split(","):
            logs = folder / f"logs-{name}"
            with faults[name](folder / f"redis-{name}.log") as fault:
                stack = stack_on(checkpoint, {"vision": 1, "prefill": 1, "decode": 1}, logs, QUICK_LEASES)
                stack.redis_url = fault.url
                with running(stack):
                    served = outages_on(stack, fault, name, outages, logs)
            for outage_s, times in served.items():
                medians = [median(t[i] if t[i] is not None else GIVE_UP_S for t in times) for i in (0, 1)]
                print(row(f"{name} median", f"{outage_s:.0f}", *(f"{m:.1f}" for m in medians), "", "", "", ""))


if __name__ == "__main__":
    main()
