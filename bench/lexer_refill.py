"""Does a request whose grammar's lexer fills stall the decode batch while its grammar compiles anew?

In-process prefill and decode loops on the demo checkpoint and a Redis of their own. ``--plain``
greedy requests stream ``--tokens`` tokens each beside ``--guided`` requests that follow a schema of
``--properties`` required integers after a string of pattern ``^[ab]*a[ab]{20}$`` (each reply of
random a/b writes new lexer states; the lexer holds ``--states``, a few replies fill it). A request
meeting the full lexer is held while a fresh compile (seconds for a schema this wide) runs in a
thread; the batch steps on. Reports each decode step's time (every step, and those that ran while a
compile of the grammar ran), the compiles' times (what a compile on the loop would have stalled the
batch by), and how the requests ended.

    .venv/bin/python bench/lexer_refill.py [--properties 4000] [--states 250] [--trials 2]
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import llguidance
from options import bench_parser

from dayzero import grammars
from dayzero.chat.grammar import json_grammar
from dayzero.chat.schema_rows import ROW_ITEMS
from dayzero.demo import write_demo_checkpoint
from dayzero.params import Grammar, SamplingParams
from dayzero.procs import scratch_redis
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.queue import composer, make_celery
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

PATTERN = {"type": "string", "pattern": "^[ab]*a[ab]{20}$"}


def requests(args, salt: int) -> list[GenerationRequest]:
    props = {"s": PATTERN} | {f"p{salt}_{j}": {"type": "integer"} for j in range(args.properties)}  # (new each trial)
    lark = json_grammar({"type": "object", "properties": props, "required": list(props)})
    plain = [SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)] * args.plain
    guided = [SamplingParams(max_tokens=40, temperature=1.0, seed=i, grammar=Grammar(lark)) for i in range(args.guided)]
    return [
        GenerationRequest(request_id=f"t{salt}-{i}", prompt_ids=(0, 5, 4, 3, 2), sampling=s, created=time.time())
        for i, s in enumerate(plain + guided)
    ]


def run(loop, jobs: list) -> None:
    tickets = [loop.intake.submit(job) for job in jobs]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    assert all(t.done.wait(600) for t in tickets)
    loop.stop.set()
    thread.join(30)


def timed(obj, name: str, spans: list) -> None:
    """Record each call of ``obj.name`` as (start, end), perf_counter's."""
    call = getattr(obj, name)

    def wrapper(*a, **kw):
        start = time.perf_counter()
        try:
            return call(*a, **kw)
        finally:
            spans.append((start, time.perf_counter()))

    setattr(obj, name, wrapper)


def trial(settings: Settings, args, salt: int) -> dict:
    store, sent = Lifecycle.connect(settings.redis_url), []
    batch = requests(args, salt)
    for request in batch:
        store.admit(request, [], "", 600)
    compose = composer(make_celery(settings), "decode")
    prefill = Runtime.load(settings, f"prefill{salt}@bench", "prefill", False)
    run(PrefillLoop(prefill, lambda job: sent.append(job) or compose(job)), [PrefillJob(request=r) for r in batch])
    decode = Runtime.load(settings, f"decode{salt}@bench", "decode", False)
    loop, steps, compiles = DecodeLoop(decode), [], []
    timed(loop, "_step", steps)  # (a held row's resume, the decode, the append)
    timed(decode.codec.grammars, "_compile", compiles)
    run(loop, sent)
    during = [end - start for start, end in steps if any(a < end and start < b for a, b in compiles[1:])]
    return {
        "steps": [end - start for start, end in steps],
        "during": during,
        "compiles": [end - start for start, end in compiles],
        "ends": Counter(store.done(r.request_id) for r in batch),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--properties", type=int, default=4000)
    parser.add_argument("--states", type=int, default=250)
    parser.add_argument("--plain", type=int, default=2)
    parser.add_argument("--guided", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    fuel = {"initial_lexer_fuel": 200_000, "step_lexer_fuel": 100_000}
    few = llguidance.LLParserLimits(**fuel, max_lexer_states=args.states, max_items_in_row=ROW_ITEMS)
    grammars.parser_limits = lambda: few  # (this process's compiles: a few replies fill a lexer)
    with tempfile.TemporaryDirectory() as tmp, scratch_redis() as port:
        write_demo_checkpoint(Path(tmp))
        settings = Settings(checkpoint=Path(tmp), redis_url=f"redis://127.0.0.1:{port}/0", handoff="redis")
        rows = [trial(settings, args, i) for i in range(args.trials)]
    print(
        f"{args.plain} plain + {args.guided} guided requests; {args.properties} properties, {args.states} lexer states"
    )
    print("| trial | steps: median | steps: max | steps during a recompile: n, median, max | compiles (s) | ends |")
    print("|---:|---:|---:|---:|---:|---|")
    for i, row in enumerate(rows):
        steps, during = row["steps"], row["during"] or [float("nan")]
        compiled = ", ".join(f"{s:.2f}" for s in row["compiles"])
        print(
            f"| {i} | {statistics.median(steps) * 1e3:.1f} ms | {max(steps) * 1e3:.1f} ms "
            f"| {len(row['during'])}, {statistics.median(during) * 1e3:.1f} ms, {max(during) * 1e3:.1f} ms "
            f"| {compiled} | {dict(row['ends'])} |"
        )


if __name__ == "__main__":
    main()
