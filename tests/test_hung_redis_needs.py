"""``bench/hung_redis.py`` refuses a fault this host cannot make before it starts anything: without
``tc`` (or ``ip``, or root) it wrote the demo checkpoint, started Redis and the stack, and failed at
the first cut in a traceback (``FileNotFoundError: 'tc'``), or at its namespace's ``ip netns add``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "hung_redis.py"


@pytest.mark.parametrize(
    ("fault", "tools", "says"), [("partitioned", ["ip"], "root, ip and tc"), ("unreachable", [], "root and ip")]
)
def test_a_fault_whose_tools_are_missing_is_refused_in_one_line(tmp_path, fault, tools, says):
    for tool in tools:
        if (found := shutil.which(tool)) is None:
            pytest.skip(f"no {tool} here to leave on PATH")
        os.symlink(found, tmp_path / tool)
    env = {**os.environ, "PATH": str(tmp_path)}  # (tc, and ip where left out, not on it)
    ran = subprocess.run(
        [sys.executable, str(BENCH), "--faults", fault, "--keep", str(tmp_path / "kept")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert f"--faults {fault} needs {says}" in ran.stderr and "Traceback" not in ran.stderr
    assert not (tmp_path / "kept").exists()  # (nothing started)


def test_a_fault_of_another_name_is_refused():
    ran = subprocess.run([sys.executable, str(BENCH), "--faults", "frozn"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2 and "'frozn' is none of frozen, unreachable, partitioned" in ran.stderr, ran.stderr


def test_a_retransmission_cap_out_of_the_sysctls_range_is_refused():
    """200 ms (below the sysctl's 1000) made the namespace, then ended in a traceback of ``sysctl``."""
    ran = subprocess.run(
        [sys.executable, str(BENCH), "--redis-rto-max-ms", "200"], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 2 and "tcp_rto_max_ms takes 1000 to 120000, not 200" in ran.stderr, ran.stderr
