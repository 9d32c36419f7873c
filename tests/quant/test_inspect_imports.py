"""`dayzero inspect` plans from headers and config on torch's meta device: it runs no kernel, so
a fresh interpreter running it imports neither triton nor numba (with them: ~0.3 s more CPU and
~300 more modules, in each of the ~10 test subprocesses and each user's run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dayzero.demo import write_demo_checkpoint

RUN_INSPECT = """
import contextlib, io, json, sys
from dayzero import cli
runs = [json.loads(arg) for arg in sys.argv[1:]]
with contextlib.redirect_stdout(io.StringIO()):
    codes = [cli.main(argv) for argv in runs]
print(json.dumps({"codes": codes, "kernel_compilers": sorted({"triton", "numba"} & sys.modules.keys())}))
"""


def test_inspect_imports_no_kernel_compiler(tmp_path):
    float_demo = write_demo_checkpoint(tmp_path / "float")
    fp4_demo = write_demo_checkpoint(tmp_path / "fp4", fp4=True)
    runs = [
        ["inspect", str(float_demo)],
        ["inspect", str(fp4_demo), "--json", "--expert-cache-gib", "1"],
        ["inspect", str(float_demo), "--tensor-parallel", "2"],
        ["inspect", "deepseek-v4-flash", "--devices", "8"],
    ]
    env = {**os.environ, "DAYZERO_SPECULATIVE_TOKENS": "1"}  # the speculation check runs too
    out = subprocess.run(
        [sys.executable, "-c", RUN_INSPECT, *map(json.dumps, runs)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"codes": [0, 0, 0, 0], "kernel_compilers": []}
