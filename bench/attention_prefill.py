"""Part 3 of bench/attention.py: prefill time and peak RSS (peak_rss.py), dayzero vs transformers, on
the tiny demo model; each run in its own process with a 12 GiB address-space cap, so that
transformers' quadratic prefill fails cleanly where it stops fitting."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

PREFILL_CHILD = """
import json, resource, sys, time, torch
resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
engine, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from peak_rss import PeakRSS
ids = torch.randint(2, 500, (n,)).tolist()
try:
    if engine == "dayzero":
        from dayzero.checkpoint import load_model
        from dayzero.kv.pools import pools_for
        from dayzero.model.forward import prefill
        import dayzero.model.attention as attention
        spent, select = [0.0], attention.indexer_topk

        def timed(*args, **kwargs):  # the indexer's share of the prefill
            begin = time.perf_counter()
            picked = select(*args, **kwargs)
            spent[0] += time.perf_counter() - begin
            return picked

        attention.indexer_topk = timed
        model = load_model(path, progress=False)
        prefill(model, pools_for(model.cfg, torch.float32, 64), ["w"], [ids[:64]])  # a worker's warm-up:
        spent[0] = 0.0  # numba's compiled loops loaded from its cache (0.3-0.5 s) before the clock starts
        pools = pools_for(model.cfg, torch.float32, n)
        peak = PeakRSS()
        start = time.perf_counter()
        prefill(model, pools, ["s"], [ids], chunk_size=2048)
    else:
        from transformers import DeepseekV4ForCausalLM
        model = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        peak = PeakRSS()
        start = time.perf_counter()
        with torch.no_grad():
            model(torch.tensor([ids]), logits_to_keep=1)
    seconds = time.perf_counter() - start
    extra = {"indexer_s": spent[0]} if engine == "dayzero" else {}
    print(json.dumps({"seconds": seconds, "peak_mib": peak.mib(), **extra}))
except (MemoryError, RuntimeError) as exc:
    print(json.dumps({"error": type(exc).__name__}))
"""


def prefill_run(engine: str, path: Path, tokens: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PREFILL_CHILD, engine, str(path), str(tokens), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": f"exit {out.returncode}"}


def prefill_table(lengths: list[int], reference: bool) -> list[tuple[int, dict, dict]]:
    from dayzero.demo import DEMO_CONFIG, write_checkpoint

    print("\n3. prefill on the tiny demo model (fp32 CPU, own process each, 12 GiB cap; dayzero after a warm-up)")
    print("| tokens | dayzero s | (indexer s) | dayzero peak MiB | transformers s | transformers peak MiB |")
    print("|-------:|----------:|------------:|-----------------:|---------------:|----------------------:|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(tmp, {**DEMO_CONFIG, "sliding_window": 128}, seed=0)
        ref_failed = not reference
        for n in lengths:
            ours_run = prefill_run("dayzero", path, n)
            ref_run = {"error": "skipped"} if ref_failed else prefill_run("transformers", path, n)
            ref_failed = "error" in ref_run
            rows.append((n, ours_run, ref_run))
            ours, ref = (_cells(run) for run in (ours_run, ref_run))
            print(f"| {n:6d} | {ours[0]:>9} | {ours[2]:>11} | {ours[1]:>16} | {ref[0]:>14} | {ref[1]:>21} |")
    return rows


def _cells(run: dict) -> tuple[str, str, str]:
    """(seconds, peak MiB, indexer seconds) of a prefill run, or its error."""
    if "error" in run:
        return run["error"], "-", "-"
    return f"{run['seconds']:.2f}", f"{run['peak_mib']:.0f}", f"{run.get('indexer_s', 0):.2f}"
