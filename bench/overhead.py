"""Pipeline overhead: TTFT through the gateway minus the same engine's in-process TTFT, by hop.

Starts an idle stack (``dayzero up`` machinery: embedded Redis, the gateway, 1 prefill and 1
decode worker, demo checkpoint) and alternates, request by request, one streamed completion
through the gateway (greedy, 2 tokens, a prompt whose first token is text on its own) sent by
httpx (each answer read to its end: one kept-alive connection, as a user's client has), the same
request sent by a minimal client (``sse_clients.RawClient``), and the same prompt's prefill and
first-token pick in this process, so all three see the same machine load. After each run both
clients are timed against a local server that replays the gateway's answer at once: each
client's own time to the first event, the part of its TTFT that no server work can cut; the
table shows the overhead with httpx as measured, and less httpx's own time.
The stack runs twice: tracing off (the default: the headline), then on (console exporter, a JSON
file per process), where each request's spans give the hops:

    client send ─ gateway (HTTP) ─ admission (validate, until the enqueue is sent) ─ queue hop
    (enqueue sent -> prefill task starts: Redis, Celery's consumer, its pool thread) ─ claim (task
    -> its take answered: the job parsed, one round trip) ─ loop pickup (-> forward starts: the loop
    thread's wake, blocks reserved) ─ forward (-> logits) ─ first-token sampling (-> XADD sent) ─
    gateway read (XADD sent -> the gateway has the entry) ─ SSE write (-> the client has it)

(A mark is stamped when its side sends, not when its call returns: the other side may act first;
the claim's once its answer is back: the loop can have the job no sooner.)

Each stack's processes report the CPU time they spent per request (psutil: user + system, a
round's warm-ups included; idle they use next to none). Each stack's first request, sent as soon
as it is ready, is timed on its own (a worker's first calls: its warm-up's business). Medians per
run, then the median of the runs. Run: ``python bench/overhead.py [--runs 3] [--requests 15]
[--prompt-tokens 128]``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import torch
from options import bench_parser
from sse_clients import RawClient, own_ttft, stream_once

HOPS = (
    ("client -> gateway (HTTP)", "send", "server"),
    ("gateway admission (validate, until the enqueue is sent)", "server", "queued"),
    ("queue hop (enqueue sent -> prefill task starts)", "queued", "task"),
    ("claim (task -> its take answered)", "task", "claimed"),
    ("loop pickup (claimed -> forward starts)", "claimed", "forward"),
    ("forward (-> the last chunk's logits)", "forward", "forwarded"),
    ("first-token sampling (logits -> XADD sent)", "forwarded", "published"),
    ("gateway read (XADD sent -> stream entry read)", "published", "read"),
    ("SSE write (-> client has the first token)", "read", "first"),
)


class Engine:
    """The same checkpoint in this process: one prefill and the greedy first token, timed."""

    def __init__(self, checkpoint: Path) -> None:
        from dayzero.checkpoint import load_model
        from dayzero.tokenizer import load_codec

        self.model, self.codec = load_model(checkpoint, progress=False), load_codec(checkpoint)

    def first_token(self, prompt: list[int]) -> tuple[float, int]:
        from dayzero.kv.pools import pools_for
        from dayzero.model.forward import prefill

        pools = pools_for(self.model.cfg, torch.float32, len(prompt) + 1)
        start = time.perf_counter()
        token = int(prefill(self.model, pools, ["s"], [prompt])[0].argmax())
        return time.perf_counter() - start, token

    def text_prompt(self, length: int) -> list[int]:
        """A prompt whose greedy first token decodes to text alone (a partial UTF-8 character
        would be held back by the gateway until the next token, which is decode's)."""
        for shift in range(500):
            prompt = [0] + [(7 * k + shift) % 498 + 2 for k in range(length - 1)]
            text = self.codec.decode_all([self.first_token(prompt)[1]])
            if text and "\ufffd" not in text:
                return prompt
        raise RuntimeError("no prompt of this length starts with a whole character")


def alternate(url: str, engine: Engine, prompt: list[int], n: int) -> tuple[list[dict], list[dict], list[float], bytes]:
    """``n`` rounds on an idle stack: a gateway request by httpx, one by the raw client, one
    in-process run; and the bytes of the gateway's last answer."""
    requests, raw, local = [], [], []
    bare = RawClient(url)
    with httpx.Client(timeout=60) as client:
        for _ in range(3):  # warm-up: connections, first-call paths in every process
            stream_once(client, url, prompt)
            bare.stream(prompt)
            engine.first_token(prompt)
        for _ in range(n):
            requests.append(stream_once(client, url, prompt))
            time.sleep(0.05)  # decode's token and the stream's end settle
            raw.append(bare.stream(prompt))
            time.sleep(0.05)
            local.append(engine.first_token(prompt)[0])
            time.sleep(0.05)
    bare.close()
    return requests, raw, local, bare.answer


def _ns(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1e6) * 1000


MARKS = {  # mark: (span, its event; None: the span's start)
    "server": ("POST /v1/completions", None),
    "queued": ("gateway.request", "queued"),
    "task": ("run/dayzero.prefill", None),
    "claimed": ("run/dayzero.prefill", "claimed"),  # the claim's take answered, on the task's thread
    "forward": ("prefill.forward", None),
    "forwarded": ("prefill.forward", "forward_ended"),
    "published": ("prefill.forward", "tokens_appended"),  # the first token's XADD sent
    "read": ("gateway.request", "first_token"),
}


def _stamp(span: dict | None, event: str | None) -> int | None:
    if span is None:
        return None
    if event is None:
        return _ns(span["start_time"])
    return next((_ns(e["timestamp"]) for e in span["events"] if e["name"] == event), None)


def span_marks(folder: Path, requests: list[dict], whole: bool = True) -> list[dict]:
    """Each request's marks (ns) from its trace's spans; requests with a mark missing drop out
    (``whole``), else keep it as None (a tree from before the mark: bench/hops_ab.py)."""
    spans = [json.loads(line) for f in folder.glob("*.jsonl") for line in f.read_text().splitlines() if line]
    by_trace: dict[str, dict[str, dict]] = {}
    for span in spans:
        by_trace.setdefault(span["context"]["trace_id"], {})[span["name"]] = span
    roots = {s["attributes"].get("dayzero.request_id"): s for s in spans if s["name"] == "gateway.request"}
    out = []
    for req in requests:
        root = roots.get(req["rid"])
        trace = by_trace[root["context"]["trace_id"]] if root else {}
        marks = {mark: _stamp(trace.get(name), event) for mark, (name, event) in MARKS.items()}
        if root and (None not in marks.values() or not whole):
            out.append({**req, **marks})
    return out


def hops(marked: dict) -> dict[str, float]:
    """A request's hops (ms) from its marks (those whose two marks it has)."""
    return {name: (marked[b] - marked[a]) / 1e6 for name, a, b in HOPS if None not in (marked[a], marked[b])}


def cpu_seconds(stack) -> dict[str, float]:
    """CPU time (user + system) each of the stack's processes has used so far, its children's included."""
    import psutil

    used = {}
    for child in stack.children:
        proc = psutil.Process(child.proc.pid)
        used[child.name] = sum(sum(p.cpu_times()[:2]) for p in (proc, *proc.children(recursive=True)))
    return used


def run_stack(
    checkpoint: Path, folder: Path, traced: bool, engine: Engine, prompt: list[int], args
) -> tuple[list[dict], float, dict[str, float]]:
    """One stack; per run: p50 of gateway TTFT, in-process TTFT, and (traced) of each hop, in ms;
    the TTFT (ms) of the fresh stack's first request, sent as soon as it is ready, and (traced)
    that request's hops."""
    from demo_stack import running, stack_on

    spans = folder / "spans"
    spans.mkdir(parents=True)
    settings = {"OMP_NUM_THREADS": str(args.threads)}
    if traced:
        settings.update(DAYZERO_TRACE_EXPORTER="console", DAYZERO_TRACE_FILE=str(spans))
    runs = []
    with running(stack_on(checkpoint, {"prefill": 1, "decode": 1}, folder / "logs", settings)) as stack:
        fresh = RawClient(stack.url)
        sent = fresh.stream(prompt)
        fresh.close()
        first_ms = (sent["first"] - sent["send"]) / 1e6
        for _ in range(args.runs):
            before = cpu_seconds(stack)
            requests, raw, local, answer = alternate(stack.url, engine, prompt, args.requests)
            own = own_ttft(answer, prompt, args.requests)
            row = {
                "gateway": statistics.median((r["first"] - r["send"]) / 1e6 for r in requests),
                "gateway, raw client": statistics.median((r["first"] - r["send"]) / 1e6 for r in raw),
                "in-process": statistics.median(local) * 1e3,
                "client's own (its answer replayed at once): httpx": own["httpx"],
                "client's own (its answer replayed at once): raw client": own["raw"],
            }
            served = 2 * (len(requests) + 3)  # both clients' requests, the warm-ups' included
            for name, seconds in cpu_seconds(stack).items():
                row[f"CPU per request: {name}"] = (seconds - before[name]) / served * 1e3
            if traced:
                time.sleep(1.0)  # the last spans reach their files
                marked = [hops(m) for m in span_marks(spans, requests)]
                for name, _, _ in HOPS:
                    row[name] = statistics.median(m[name] for m in marked) if marked else float("nan")
                row["requests with every span"] = len(marked)
            runs.append(row)
        first_hops = next((hops(m) for m in span_marks(spans, [sent])), {}) if traced else {}
    return runs, first_ms, first_hops


def table(title: str, runs: list[dict]) -> None:
    print(f"\n{title}")
    print("| ms (p50) | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | median |")
    print("|---|" + "---:|" * (len(runs) + 1))
    for row in runs:
        row["overhead (gateway - in-process)"] = row["gateway"] - row["in-process"]
        row["overhead, raw client"] = row["gateway, raw client"] - row["in-process"]
        own = row["client's own (its answer replayed at once): httpx"]
        row["overhead less httpx's own time"] = row["overhead (gateway - in-process)"] - own
    for name in runs[0]:
        values = [row[name] for row in runs]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {statistics.median(values):.1f} |")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=15, help="gateway requests (and in-process runs) per run")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch threads here and in each worker")
    args = parser.parse_args()

    from dayzero.demo import write_demo_checkpoint

    torch.set_num_threads(args.threads)  # the workers' count: two processes of 2 on 2 cores thrash
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_demo_checkpoint(Path(tmp) / "demo")
        engine = Engine(checkpoint)
        prompt = engine.text_prompt(args.prompt_tokens)
        plain = run_stack(checkpoint, Path(tmp) / "plain", False, engine, prompt, args)
        traced = run_stack(checkpoint, Path(tmp) / "traced", True, engine, prompt, args)
    print(
        f"prompt {args.prompt_tokens} tokens, {args.requests} requests per run, 1 prefill + 1 decode worker, "
        f"{args.threads} torch thread(s) each, "
        f"tiny demo model, CPU; load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    table("tracing off (the default)", plain[0])
    table("tracing on (console exporter): the hops from each request's spans", traced[0])
    print(f"\nfirst request of a fresh stack (minimal client): TTFT {plain[1]:.1f} ms, traced {traced[1]:.1f} ms")
    if traced[2]:
        print("its hops, traced: " + ", ".join(f"{name.split(' (')[0]} {ms:.1f}" for name, ms in traced[2].items()))


if __name__ == "__main__":
    main()
