"""How long each host's torchrun takes to exit once host 0's is stopped (SIGTERM, as its supervisor
stops it): both torchruns on this machine's loopback (tests/parallel/test_torchruns.py's set-up),
one gloo rank each that ends on rank 0's SIGTERM, as dayzero's stop message ends a group.

Host 1's rank exits 0 and its agent meets host 0's store gone at torchrun's exit barrier; printing
that traceback with torch's own log format imports torch._dynamo. ``torch's format``: no
TORCH_LOGS_FORMAT; ``image's``: docker/base.Dockerfile's. Seconds from the SIGTERM to each
torchrun's exit, medians of ``--runs`` (interleaved; each run's numbers printed as it ends). No root
needed. Run: ``python bench/torchrun_stop.py [--runs 5]``.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from options import bench_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' torchrun helpers

from tests.parallel.test_torchruns import STOPPED_BY_RANK_0, Torchruns, image_env  # noqa: E402

FORMATS = {"torch's format": {}, "image's": {"TORCH_LOGS_FORMAT": image_env()["TORCH_LOGS_FORMAT"]}}


def one_run(env: dict[str, str]) -> tuple[float, float]:
    """Seconds from the SIGTERM to host 0's torchrun's exit and to host 1's."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = Torchruns(Path(tmp), rank=STOPPED_BY_RANK_0, env=env)
        try:
            for node in (0, 1):
                runs.start(node)
            runs.formed(1)
            stopped, ended = time.monotonic(), [0.0, 0.0]
            runs.agents[0].send_signal(signal.SIGTERM)
            while not all(ended):
                for node, agent in enumerate(runs.agents):
                    if not ended[node] and agent.poll() is not None:
                        ended[node] = time.monotonic() - stopped
                time.sleep(0.02)
            return ended[0], ended[1]
        finally:
            runs.stop()


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in FORMATS}
    for run in range(args.runs):
        for name, env in FORMATS.items():  # interleaved: the machine's load falls on both alike
            results[name].append(one_run(env))
            host0, host1 = results[name][-1]
            print(f"run {run + 1} {name}: host 0's torchrun {host0:.2f} s, host 1's {host1:.2f} s")
    print(f"\nmedians of {args.runs} runs, s after SIGTERM to host 0's torchrun (max in brackets)")
    print(f"{'log format':<16}{'host 0 exits':>16}{'host 1 exits':>16}")
    for name, taken in results.items():
        cells = [f"{statistics.median(t[i] for t in taken):.2f} ({max(t[i] for t in taken):.2f})" for i in (0, 1)]
        print(f"{name:<16}" + "".join(f"{cell:>16}" for cell in cells))
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
