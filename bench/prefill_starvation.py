"""How long a long prompt waits to start in prefill under a steady stream of short prompts, and the
short prompts' time to first token: the loop's own scheduler (``prefilling.take_batch`` and
``plan_step``), stepped here with no model (each step one ``--step-ms``), so that a load sweep runs
in seconds and is the same on any machine.

Short prompts (lengths uniform in ``--short`` tokens) arrive as a Poisson stream offering ``load``
times a step's tokens (DAYZERO_MAX_PREFILL_TOKENS) per step; one long prompt arrives at step ``--long-at``.
A short prompt's time to first token here is the steps from its arrival to the end of the step
that ran its last chunk, in ms; the long prompt's wait, from its arrival to its first chunk.
Prompts waiting past ``--horizon`` steps still count (the run goes on, with no more arrivals,
until every prompt ended). Run: ``python bench/prefill_starvation.py [--chunk 256 --budget 256]``.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from options import bench_parser

from dayzero.params import SamplingParams
from dayzero.serving.intake import Ticket
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_batch import BatchInput
from dayzero.serving.prefilling import Prefilling, plan_step, take_batch
from dayzero.settings import Settings

_KNOWN = "prefill_pass_s" in Settings.model_fields  # (a tree before DAYZERO_PREFILL_PASS_S: not)


@dataclass(frozen=True)
class Scenario:
    chunk: int  # DAYZERO_PREFILL_CHUNK_SIZE
    budget: int  # DAYZERO_MAX_PREFILL_TOKENS
    short: tuple[int, int]  # short prompts' lengths, min max
    long: int  # the long prompt's tokens
    long_at: int  # the step it arrives before
    horizon: int  # steps with arrivals
    step_s: float
    pass_s: float  # DAYZERO_PREFILL_PASS_S (a tree before it: ignored)


def simulate(sc: Scenario, load: float, seed: int) -> dict:
    """One run -> the long prompt's wait and TTFT, the short ones' TTFT percentiles (ms)."""
    rng = random.Random(seed)
    rate = load * sc.budget / ((sc.short[0] + sc.short[1]) / 2)  # short prompts per step
    pending: list[Ticket[PrefillJob]] = []
    running: list[Prefilling] = []
    arrived: dict[str, int] = {}
    started: dict[str, int] = {}
    ended: dict[str, int] = {}
    origin = time.time()  # unix time of step 0: an arrival's admission time is origin + its step's time
    step, n = 0, 0
    while step < sc.horizon or pending or running:
        arrivals = _poisson(rng, rate) if step < sc.horizon else 0
        new = [(f"short-{n + i}", rng.randint(*sc.short)) for i in range(arrivals)]
        if step == sc.long_at:
            new.append(("long", sc.long))
        n += arrivals
        for rid, length in new:
            arrived[rid] = step
            pending.append(_ticket(rid, length, origin + step * sc.step_s))
        pending.sort(key=lambda t: t.job.request.created)  # (first_come)
        args = (pending, running, sc.chunk, sc.budget)
        taken = take_batch(*args, sc.pass_s, origin + step * sc.step_s) if _KNOWN else take_batch(*args)
        for ticket in taken:
            rid = ticket.job.request.request_id
            started[rid] = step
            running.append(Prefilling([ticket], BatchInput(rid, list(ticket.job.request.prompt_ids)), []))
        rows, chunks = plan_step(running, sc.chunk, sc.budget)
        for p, c in zip(rows, chunks, strict=True):
            p.prefilled += len(c.tokens)
            if not p.left:
                ended[p.input.seq_id] = step
        running = [p for p in running if p.left]
        step += 1
    ms = sc.step_s * 1000
    ttft = [(ended[r] + 1 - arrived[r]) * ms for r in ended if r != "long"]
    return {
        "long_wait": (started["long"] - arrived["long"]) * ms,
        "long_ttft": (ended["long"] + 1 - arrived["long"]) * ms,
        "short_p50": statistics.median(ttft),
        "short_p99": statistics.quantiles(ttft, n=100)[98],
    }


def _poisson(rng: random.Random, mean: float) -> int:
    count, t = 0, rng.expovariate(1.0)
    while t < mean:
        count, t = count + 1, t + rng.expovariate(1.0)
    return count


def _ticket(rid: str, length: int, created: float) -> Ticket[PrefillJob]:
    prompt = tuple((i * 7 + len(rid)) % 1000 for i in range(length))
    request = GenerationRequest(request_id=rid, prompt_ids=prompt, sampling=SamplingParams(), created=created)
    return Ticket(PrefillJob(request=request))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--chunk", type=int, default=256, help="DAYZERO_PREFILL_CHUNK_SIZE")
    parser.add_argument("--budget", type=int, default=256, help="DAYZERO_MAX_PREFILL_TOKENS")
    parser.add_argument("--short", type=int, nargs=2, default=(16, 96), help="short prompts' lengths, min max")
    parser.add_argument("--long", type=int, default=3000, help="the long prompt's tokens")
    parser.add_argument("--long-at", type=int, default=400, help="the step the long prompt arrives before")
    parser.add_argument("--loads", type=float, nargs="+", default=(0.8, 0.95, 1.0, 1.05, 1.2))
    parser.add_argument("--horizon", type=int, default=2000, help="steps with arrivals")
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--pass-s", type=float, default=Settings().prefill_pass_s if _KNOWN else 0.0)
    parser.add_argument("--seeds", type=int, default=5)
    a = parser.parse_args()
    sc = Scenario(a.chunk, a.budget, tuple(a.short), a.long, a.long_at, a.horizon, a.step_ms / 1000, a.pass_s)
    bound = f"DAYZERO_PREFILL_PASS_S {a.pass_s:g}" if _KNOWN else "no DAYZERO_PREFILL_PASS_S (this tree)"
    print(f"chunk {a.chunk}, step {a.budget} tokens of {a.step_ms:g} ms, shorts {a.short[0]}-{a.short[1]} tokens, ")
    print(f"a {a.long}-token prompt at step {a.long_at}, {bound}; medians of {a.seeds} seeds (worst: of the seeds)")
    print("\n| load | long waits to start, ms | long TTFT, ms | short TTFT p50 ms | short p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for load in a.loads:
        runs = [simulate(sc, load, seed) for seed in range(a.seeds)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        worst = max(r["long_wait"] for r in runs)
        print(
            f"| {load:g} | {med['long_wait']:.0f} (worst {worst:.0f}) | {med['long_ttft']:.0f} | "
            f"{med['short_p50']:.0f} | {med['short_p99']:.0f} |"
        )


if __name__ == "__main__":
    main()
