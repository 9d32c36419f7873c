"""A worker's log lines through a Redis outage: Celery's and kombu's own (its consumer's reconnect
lines) and dayzero's, per worker.

Starts a stack of 1 prefill and 1 decode worker on the demo checkpoint (leases of 1 s), streams a long
request (decode holds it as Redis goes), kills Redis for ``--outage-s``, restarts it on its port and
waits for ``/ready`` and ``--after-s`` more (the counts that close a period); ``--refuse``: Redis at its
memory limit for ``--outage-s`` instead (it refuses writes and scripts; the queue reads go on). Counts, in each worker's
log from the kill on, the log records (a traceback's lines are one record's) and the physical lines,
Celery's and kombu's apart (``--show``: their records, one per kind).
Run: ``python bench/outage_log_lines.py [--outage-s 30] [--after-s 12] [--refuse] [--show]``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services.launch import stream_in_flight  # noqa: E402

RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: \w+/[\w-]+\] ")
# Celery's own lines of a lost broker connection, and dayzero's lines that count those it held back
CELERYS = re.compile(
    r"consumer: |Connected to |CPendingDeprecationWarning|Skipping prefetch count|Frequent restarts|"
    r"Redis BRPOP got no reply|Unrecoverable error|Celery's|maybe_refresh_binding_expiry|bindings refreshed"
)


def records(text: str) -> list[str]:
    """The log's records: a line with a record's head, and the lines after it that have none."""
    found: list[str] = []
    for line in text.splitlines():
        if RECORD.match(line) or not found:
            found.append(line)
        else:
            found[-1] += "\n" + line
    return found


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--outage-s", type=float, default=30.0)
    p.add_argument("--after-s", type=float, default=12.0)
    p.add_argument("--show", action="store_true", help="print Celery's records, the first of each kind")
    p.add_argument("--refuse", action="store_true", help="Redis at its memory limit, not killed")
    p.add_argument("--keep", default="", help="a folder to keep the stack's logs in")
    args = p.parse_args()
    workers = {"vision": 0, "prefill": 1, "decode": 1}
    with scratch(args.keep) as folder, demo_stack(folder, workers, QUICK_LEASES) as stack:
        logs = {name: folder / "logs" / f"{name}.log" for name in ("prefill0", "decode0")}
        assert stream_in_flight(stack.url).wait(60), "the stream did not start"
        start = {name: len(log.read_text()) for name, log in logs.items()}
        if args.refuse:
            r = redis.Redis.from_url(stack.redis_url)
            r.config_set("maxmemory", 1)
            time.sleep(args.outage_s)
            r.config_set("maxmemory", 0)
        else:
            stack.redis.kill()
            stack.redis.wait()
            time.sleep(args.outage_s)
            assert stack.supervise() == ["redis"]
        stack.wait_ready(timeout_s=120)
        time.sleep(args.after_s)
        outage = "at its memory limit" if args.refuse else "out"
        print(f"Redis {outage} {args.outage_s:.0f} s, logs read {args.after_s:.0f} s after /ready")
        print(f"{'worker':10} {'records':>8} {'celery':>7} {'dayzero':>8} {'lines':>6} {'celery lines':>13}")
        for name, log in logs.items():
            report(name, log.read_text()[start[name] :], args.show)


def report(name: str, text: str, show: bool) -> None:
    found = records(text)
    celerys = [r for r in found if CELERYS.search(r.partition("\n")[0])]
    lines, celery_lines = (sum(r.count("\n") + 1 for r in some) for some in (found, celerys))
    print(f"{name:10} {len(found):8} {len(celerys):7} {len(found) - len(celerys):8} {lines:6} {celery_lines:13}")
    if show:
        kinds: dict[str, list[str]] = {}
        for r in found:
            kinds.setdefault(RECORD.sub("", r)[:40], []).append(r.partition("\n")[0])
        print("\n".join(f"  {len(seen)}x {seen[0][:160]}" for seen in kinds.values()))


if __name__ == "__main__":
    main()
