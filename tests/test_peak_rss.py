"""bench/peak_rss.py: the peak resident set of a stretch of work, after an earlier, higher peak (the
prefill bench's 8k row read 0 MiB: the process had peaked higher while loading the model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

# In a fresh process: 256 MiB touched and freed, then the stretch measured: 64 MiB touched
STRETCH = """
import json, sys
sys.path.insert(0, sys.argv[1])
from peak_rss import peak_above, start_peak
earlier = b"\\x01" * (256 << 20)
del earlier
base = start_peak()
held = b"\\x02" * (64 << 20)
print(json.dumps({"peak_mib": peak_above(base)}))
"""


def test_a_stretch_below_an_earlier_peak_reads_its_own_peak():
    out = subprocess.run([sys.executable, "-c", STRETCH, str(BENCH)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    peak = json.loads(out.stdout)["peak_mib"]
    assert 60 <= peak < 128, peak  # the 64 MiB held, not 0 (nor the earlier 256)
