"""What fencing the token stream costs: decode's per-step append as one Lua script that checks each
request's run before its XADDs (``Lifecycle.append``), against the same XADDs and cancel-mark MGET
in a plain pipeline with no check (the append before the fence).

Against an embedded redis-server, in one process: B requests leased to this writer, one token
each per step, the two appends alternating in rounds of 100 steps. Reports Redis's own time per
step (``INFO commandstats``: EVALSHA against XADD + MGET) and the call's time at the client, the
medians of the rounds. Run: ``python bench/fencing.py [--batch 1,16,64] [--rounds 7]``.
"""

from __future__ import annotations

import statistics
import time

import redis
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.records import Token, encode

STEPS = 100  # per round


def unfenced(r: redis.Redis, tokens: list[Token], watch: list[str]) -> None:
    pipe = r.pipeline(transaction=False)
    for t in tokens:
        pipe.xadd(key("tokens", t.request_id), encode(t), id=t.entry_id)
    pipe.mget([key("cancel", rid) for rid in watch])
    pipe.execute()


def rounds(store: Lifecycle, batch: int, count: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per append: (Redis us per step, client us per step) of each round."""
    r, step, out = store.r, 0, {"fenced": ([], []), "unfenced": ([], [])}
    ids = {name: [f"{name}{batch}-{i}" for i in range(batch)] for name in out}
    for rid in ids["fenced"]:
        r.set(key("lease", rid), "decode0")
    runs = dict.fromkeys(ids["fenced"], 0)
    for _ in range(count):
        for name, (server, client) in out.items():
            r.config_resetstat()
            start = time.perf_counter()
            for _ in range(STEPS):
                step += 1
                tokens = [Token(rid, step, 311, " the") for rid in ids[name]]
                if name == "fenced":
                    store.append(tokens, runs, "decode0", ids[name])
                else:
                    unfenced(r, tokens, ids[name])
            client.append((time.perf_counter() - start) / STEPS * 1e6)
            stats = r.info("commandstats")
            commands = ("evalsha",) if name == "fenced" else ("xadd", "mget")
            server.append(sum(stats[f"cmdstat_{c}"]["usec"] for c in commands) / STEPS)
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", default="1,16,64", help="requests per step, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with scratch_redis() as port:
        store = Lifecycle(redis.Redis(port=port), 600)
        store.load_scripts()
        print("| batch | Redis us/step: unfenced | fenced | ratio | call us/step: unfenced | fenced | ratio |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for batch in map(int, args.batch.split(",")):
            out = rounds(store, batch, args.rounds)
            (fs, fc), (us, uc) = ([statistics.median(v) for v in pair] for pair in out.values())
            print(f"| {batch} | {us:.1f} | {fs:.1f} | {fs / us:.1f}x | {uc:.0f} | {fc:.0f} | {fc / uc:.2f}x |")


if __name__ == "__main__":
    main()
