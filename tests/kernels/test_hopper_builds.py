"""Every Triton kernel compiles for a Hopper GPU (sm_90) within its shared memory, checked here
on CPUs: the interpreter that runs the other kernel tests never compiles them (the first H200
run found two attention kernels over the limit at DeepSeek-V4-Flash's shapes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"
KERNELS = ("prefill_kernel", "decode_split_kernel", "_scores_kernel", "_mix_kernel", "_grouped_kernel")
MODEL_ONLY = ("_compress_kernel", "_write_kernel")
pytestmark = pytest.mark.slow  # (compiles kernels for sm_90: tens of seconds)

# bench/kernel_builds.py's table and exit status, then two launches as they first ran on an H200
# (Triton 3.6), in one interpreter: torch, triton and the recorded launches once for both tests,
# and the two launches already in the table come from its Triton cache. REFUSALS marks the second part.
REFUSALS = "-- refusals --"
SCRIPT = f"""
import contextlib, io, sys
from dataclasses import replace
sys.argv = ["kernel_builds.py"]
import kernel_builds as kb
table = io.StringIO()
with contextlib.redirect_stdout(table):
    try:
        kb.main()
    except SystemExit as exit:
        code = exit.code
print(code)
print(table.getvalue(), end="")
print({REFUSALS!r})
def first(family, name):
    return next(l for l in kb.launches()[family] if l.kernel.__name__ == name)
def changed(launch, **values):
    return replace(launch, constants=tuple((n, values.get(n, v)) for n, v in launch.constants))
decode = first('V4-Flash', 'decode_split_kernel')
wide = replace(changed(decode, BH=64), options=(('num_stages', 3),))
print(kb.shared_bytes(decode), kb.shared_bytes(wide), kb.BUDGET)
scores = first('tiny', '_scores_kernel')
kb.shared_bytes(scores)
try:
    kb.shared_bytes(changed(scores, BD=8))
except Exception as err:
    print(str(err).splitlines()[-1])
"""


@pytest.fixture(scope="module")
def built() -> tuple[int, str, list[str]]:
    """kernel_builds.py's exit status and table, and the refusal part's two lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=BENCH, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    status, rest = run.stdout.split("\n", 1)
    table, refusals = rest.split(REFUSALS + "\n")
    return int(status), table, refusals.splitlines()


def test_every_kernel_compiles_for_sm90_within_the_shared_memory_budget(built):
    status, table, _ = built
    assert status == 0, table
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    seen = {(row[0].removeprefix("| "), row[1]) for row in rows[1:]}
    for family in ("tiny", "V4-Flash", "built-in model"):
        for kernel in KERNELS + (MODEL_ONLY if family == "built-in model" else ()):
            assert (family, kernel) in seen, (family, kernel)


def test_the_check_refuses_the_launches_that_broke_on_the_h200(built):
    """Two launches as they first ran on an H200 (Triton 3.6): the decode kernel with all 64 of
    V4-Flash's heads of 512 in one program (bf16) took 240 KiB of the 227 there (Triton 3.9 here
    asks 192: over the budget, which keeps 25% headroom), and the indexer's dot over a head dim
    of 8 did not compile there (3.9 compiles it). The check must refuse both."""
    sizes, refusal = built[2]
    fitted, wide, budget = map(int, sizes.split())
    assert fitted <= budget < wide
    assert "K >= 16" in refusal
