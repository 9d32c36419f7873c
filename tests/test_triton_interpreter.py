"""The interpreter's patching (``triton_interpreter``): once a launch, whatever its programs and
their device-function calls, and the same numbers."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")


@triton.jit
def _row_stats_kernel(x_ptr, out_ptr, D: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * D + tl.arange(0, D))
    tl.store(out_ptr + row * 2, tl.sum(x, axis=0))  # tl.sum and tl.max: device functions
    tl.store(out_ptr + row * 2 + 1, tl.max(x, axis=0))


def _scans(rows: int) -> int:
    """Launch the kernel over ``rows`` programs (checking its sums and maxima) -> the module scans it took."""
    scans = []
    scan = interpreter._patch_builtin
    x = torch.arange(rows * 8, dtype=torch.float32).view(rows, 8)
    out = torch.empty(rows, 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interpreter, "_patch_builtin", lambda *args: scans.append(args) or scan(*args))
        _row_stats_kernel[(rows,)](x, out, D=8)
    assert torch.equal(out, torch.stack([x.sum(1), x.amax(1)], dim=1))
    return len(scans)


def test_a_launch_patches_as_often_for_one_program_as_for_eight():
    _scans(1)  # a process's first launch scans fewer modules (3 fewer here, either way): not the count compared
    assert _scans(1) == _scans(8)  # unpatched: 16 and 100, a device function's call a scan of its module
