"""A client sending a request head without end (headers as fast as it can), against the gateway's
HTTP protocol (``services.gateway.deadline.RequestReadDeadline``) with its head bound and with the
bound lifted (as before it had one): what the attacker is answered and when, the server's peak
memory over its start, and the latency of another client's requests meanwhile.

Per round, one fresh server process per mode (uvicorn, the protocol, an app that answers 200 at
once), the modes in alternating order; the attacker sends ``--megabytes`` of headers in lines of
``--header-bytes`` (then the head's end, if still connected), a prober GETs every 50 ms. Medians
over ``--rounds``. Run: ``python bench/request_heads.py [--rounds 3] [--megabytes 20]``.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from options import bench_parser

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import sys, uvicorn
from services.gateway.deadline import RequestReadDeadline
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
protocol = type("Bound", (RequestReadDeadline,), {"max_head_bytes": int(sys.argv[2])})
uvicorn.run(app, port=int(sys.argv[1]), http=protocol, lifespan="off", log_level="critical")
"""


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def _get(port: int) -> float:
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        while s.recv(4096):
            pass
    return time.perf_counter() - started


def _round(bound: int, megabytes: int, header_bytes: int) -> dict:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(bound)], cwd=ROOT)
    try:
        deadline = time.time() + 30
        while True:
            try:
                _get(port)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        start_kib, waits, attacking = _kib(server.pid, "VmRSS"), [], True

        def probe() -> None:
            while attacking:
                waits.append(_get(port))
                time.sleep(0.05)

        prober = threading.Thread(target=probe)
        prober.start()
        line = b"x-a: " + b"a" * max(0, header_bytes - 7) + b"\r\n"
        batch, sent, answer = line * max(1, (1 << 20) // len(line)), 0, b""
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            try:
                s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")
                while sent < megabytes << 20:
                    s.sendall(batch)
                    sent += len(batch)
                s.sendall(b"\r\n")
                answer = s.recv(64)
            except OSError as exc:
                answer = answer or f"({type(exc).__name__} while sending)".encode()
        took = time.perf_counter() - started
        attacking = False
        prober.join()
        return {
            "answer": answer.split(b"\r\n")[0].decode(errors="replace")[:40],
            "answered_s": took,
            "sent_mb": sent / (1 << 20),
            "peak_mb": (_kib(server.pid, "VmHWM") - start_kib) / 1024,
            "probe_med_ms": statistics.median(waits) * 1000 if waits else float("nan"),
            "probe_max_ms": max(waits) * 1000 if waits else float("nan"),
        }
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=20)
    parser.add_argument("--header-bytes", type=int, default=10, help="bytes of each header line")
    args = parser.parse_args()
    from services.gateway.deadline import MAX_HEAD_BYTES

    modes = {"bound lifted (before)": 1 << 40, f"bound {MAX_HEAD_BYTES >> 10} KiB (after)": MAX_HEAD_BYTES}
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for i in range(args.rounds):
        for mode in list(modes)[:: 1 if i % 2 == 0 else -1]:
            runs[mode].append(_round(modes[mode], args.megabytes, args.header_bytes))
    print(f"{args.megabytes} MB of {args.header_bytes}-byte header lines; medians of {args.rounds} rounds")
    columns = ("sent MB", "answered s", "peak +MB", "probe med ms", "probe max ms")
    print(f"{'mode':26s} {'answer':38s} " + " ".join(f"{column:>12s}" for column in columns))
    for mode, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0] if k != "answer"}
        answers = ", ".join(sorted({r["answer"] for r in results}))
        print(
            f"{mode:26s} {answers:38s} {med['sent_mb']:12.1f} {med['answered_s']:12.2f} {med['peak_mb']:12.1f}"
            f" {med['probe_med_ms']:12.1f} {med['probe_max_ms']:12.1f}"
        )


if __name__ == "__main__":
    main()
