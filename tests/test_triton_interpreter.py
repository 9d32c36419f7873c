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


def _scanned(rows: int) -> list[object]:
    """Launch the kernel over ``rows`` programs (checking its sums and maxima) -> the modules it scanned."""
    scans = []
    scan = interpreter._patch_builtin
    x = torch.arange(rows * 8, dtype=torch.float32).view(rows, 8)
    out = torch.empty(rows, 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interpreter, "_patch_builtin", lambda pkg, *args: scans.append(pkg) or scan(pkg, *args))
        _row_stats_kernel[(rows,)](x, out, D=8)
    assert torch.equal(out, torch.stack([x.sum(1), x.amax(1)], dim=1))
    return scans


def test_a_launch_patches_as_often_for_one_program_as_for_eight():
    _scanned(1)  # a process's first launch scans fewer modules (3 fewer here, either way): not the ones compared
    one, eight = _scanned(1), _scanned(8)
    assert eight == one  # unpatched: 16 and 100 scans, a device function's call a scan of its module
    # tl.sum's module (triton.language.standard) names the language ``core``, the kernel's ``tl``: a device
    # function's module is still patched at its first call in a launch
    assert tl.core in one
