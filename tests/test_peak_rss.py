"""bench/peak_rss.py: the peak resident set of a stretch of work, after an earlier, higher peak (the
prefill bench's 8k row read 0 MiB: the process had peaked higher while loading the model); on a
kernel without ``/proc/self/clear_refs`` too (it died there with a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# In a fresh process (argv: bench/, the reset's file, "freed" or "held"): 256 MiB touched and freed,
# then the stretch measured: 64 MiB touched, and freed again before the reading (after 50 ms) or held
STRETCH = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import peak_rss
peak_rss.CLEAR_REFS = Path(sys.argv[2])
earlier = b"\\x01" * (256 << 20)
del earlier
peak = peak_rss.PeakRSS()
held = b"\\x02" * (64 << 20)
if sys.argv[3] == "freed":
    time.sleep(0.05)
    del held
print(json.dumps({"peak_mib": peak.mib()}))
"""


@pytest.mark.parametrize("clear_refs", ["/proc/self/clear_refs", "/nonexistent/clear_refs"], ids=["reset", "sampled"])
@pytest.mark.parametrize("end", ["held", "freed"])
def test_a_stretch_below_an_earlier_peak_reads_its_own_peak(clear_refs, end):
    """Freed before the reading, the stretch's peak is only the kernel's mark's (reset) or the
    sampler's (sampled): held, the resident set at the reading would show it whatever they did."""
    cmd = [sys.executable, "-c", STRETCH, str(BENCH), clear_refs, end]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    peak = json.loads(out.stdout)["peak_mib"]
    assert 60 <= peak < 128, peak  # the 64 MiB held, not 0 (nor the earlier 256)
    assert ("cannot reset the peak" in out.stderr) == clear_refs.startswith("/nonexistent"), out.stderr
