"""Every Triton kernel, compiled for a Hopper GPU (sm_90) on this machine, no GPU needed.

Runs each host function of bench/kernels.py (tiny shapes, and DeepSeek-V4-Flash's at short
contexts: the kernels' tile sizes depend on heads and dims, not on the context) with launches
recorded instead of run, then compiles each distinct launch for sm_90 and reports the shared
memory it asks for. A kernel that does not compile for a GPU (a tensor-core dot with K < 16,
say, under this Triton's rules or the stricter ones of the GPU host's 3.6) or needs more
shared memory than ``--budget`` exits 1: both broke launches on the first
H200 run (bench/RESULTS.md), while the CPU interpreter runs them. Run: ``python
bench/kernel_builds.py [--budget 174336]`` (tests/kernels/test_hopper_builds.py does).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from functools import cache

from options import bench_parser

# interpreted kernels cannot be compiled (``--help`` compiles nothing: it answers anyway)
if os.environ.get("TRITON_INTERPRET") == "1" and not {"-h", "--help"} & set(sys.argv[1:]):
    sys.exit("unset TRITON_INTERPRET: this compiles the kernels")
# a cache of its own (removed at exit): a cached build would skip the rules checked here
CACHE = tempfile.TemporaryDirectory(prefix="kernel-builds-")
os.environ["TRITON_CACHE_DIR"] = CACHE.name

import torch  # noqa: E402
import triton  # noqa: E402
from kernels import FLASH, FLASH_MOE, SMOKE, SMOKE_MOE, cases  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia import compiler as nvidia  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from dayzero.checkpoint import load_model  # noqa: E402
from dayzero.kv.pools import pools_for  # noqa: E402
from dayzero.model.forward import decode, prefill  # noqa: E402
from dayzero.model.plan import AttentionOptions  # noqa: E402
from dayzero.settings import BUILT_IN_MODEL  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
SHARED_LIMIT = 232448  # bytes of shared memory one block may take on an H100/H200 (227 KiB)
# the GPU host's older Triton (3.6) asked 25% more for the same kernel than this one (3.9) did
# (246016 vs 196864 bytes, bench/RESULTS.md): keep that much headroom
BUDGET = SHARED_LIMIT * 3 // 4
TYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.bool: "i1",
}
OPTIONS = ("num_warps", "num_stages")
NEWER_DOT_SIZES = nvidia.min_dot_size


@dataclass(frozen=True)
class Launch:
    kernel: JITFunction
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, int], ...]


def _type(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def record(runs) -> list[Launch]:
    """The distinct launches the calls in ``runs`` make (JITFunction.run recorded, not run)."""
    seen: dict[Launch, None] = {}

    def recorded(self: JITFunction, *args, grid, warmup, **kwargs) -> None:
        options = tuple((k, kwargs.pop(k)) for k in OPTIONS if k in kwargs)
        given = dict(zip(self.arg_names, args, strict=False)) | kwargs  # constexprs come by name
        bound = {n: given[n] for n in self.arg_names if n in given}
        params = {p.name: p for p in self.params}
        constants = tuple((n, v) for n, v in bound.items() if params[n].is_constexpr)
        signature = tuple((n, "constexpr" if params[n].is_constexpr else _type(v)) for n, v in bound.items())
        seen[Launch(self, signature, constants, options)] = None

    real = JITFunction.run
    JITFunction.run = recorded
    try:
        for run in runs:
            run()
    finally:
        JITFunction.run = real
    return list(seen)


def _dot_sizes_of_triton_3_6(target: GPUTarget):
    """The GPU host's Triton (3.6) wants K >= 16 in every tensor-core dot; 3.9 lets fp32 take 8."""
    newer = NEWER_DOT_SIZES(target)

    def check(lhs, rhs) -> tuple[int, int, int]:
        m, n, k = newer(lhs, rhs)
        return m, n, max(k, 16)

    return check


def shared_bytes(launch: Launch) -> int:
    """Shared memory the launch's kernel takes when compiled for sm_90 (raises if it cannot be,
    under this Triton's rules or the older one's on the GPU host)."""
    names = launch.kernel.arg_names
    constexprs = {(names.index(n),): v for n, v in launch.constants}
    src = ASTSource(fn=launch.kernel, signature=dict(launch.signature), constexprs=constexprs)
    nvidia.min_dot_size = _dot_sizes_of_triton_3_6
    try:
        return triton.compile(src, target=HOPPER, options=dict(launch.options)).metadata.shared
    finally:
        nvidia.min_dot_size = NEWER_DOT_SIZES


def _model_steps() -> None:
    """A prefill and decode steps of the built-in model with the Triton backend: every kernel as
    the model launches it (all three attention modes, the compressor, the window write)."""
    model = load_model(BUILT_IN_MODEL, progress=False)
    pools = pools_for(model.cfg, torch.float32, 64)
    options = AttentionOptions(backend="triton")
    prefill(model, pools, ["s"], [list(range(2, 40))], options)
    for token in range(3):
        decode(model, pools, ["s"], [token], options)


@cache
def launches() -> dict[str, list[Launch]]:
    """Per shape family, the distinct launches of every bench/kernels.py case (bf16 and fp32
    pools), and the built-in model's (recorded once a process)."""
    families = {
        "tiny": (SMOKE, SMOKE_MOE, (64, 3, 12)),
        "V4-Flash": (FLASH, {**FLASH_MOE, "experts": 8}, (512, 2, 64)),  # experts: a runtime size
    }
    out = {}
    for family, (shape, moe, sizes) in families.items():
        runs = [
            lambda run=run: run("triton")
            for dtype in (torch.bfloat16, torch.float32)
            for _, run in cases(shape, moe, sizes, "cpu", dtype)
        ]
        out[family] = record(runs)
    out["built-in model"] = record([_model_steps])
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--budget", type=int, default=BUDGET, help=f"shared bytes a kernel may take (default {BUDGET})")
    args = parser.parse_args()
    print(f"Triton kernels compiled for sm_90 by Triton {triton.__version__}: shared memory per block")
    print("| shapes | kernel | first input | constants | shared KiB | fits |")
    print("|---|---|---|---|---:|---|")
    failed = 0
    for family, found in launches().items():
        for launch in found:
            constants = ", ".join(f"{n}={v}" for n, v in launch.constants)
            try:
                shared = shared_bytes(launch)
                fits = "yes" if shared <= args.budget else f"NO (> {args.budget / 1024:.0f})"
                cell = f"{shared / 1024:.1f}"
            except Exception as err:  # noqa: BLE001 - reported per kernel, then the exit status
                fits, cell = f"NO: {str(err).splitlines()[-1][:80]}", "-"
            failed += fits != "yes"
            first = next(t for _, t in launch.signature if t.startswith("*")).removeprefix("*")
            print(f"| {family} | {launch.kernel.__name__} | {first} | {constants} | {cell} | {fits} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
