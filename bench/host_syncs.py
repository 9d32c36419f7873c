"""Where a decode step makes the host wait for the device: the operations that, on a GPU, read a
device value back (``.item()``, ``.tolist()``) or size their output by the data (``nonzero``, a
boolean mask's index, ``bincount``, ``unique``, ...), counted per source line of one step.

Each is a stall on a GPU (the host waits for every kernel launched before it, and the next
launches wait for the host), and each stands between the step and its capture in a CUDA graph.
Counted here on the CPU through torch's dispatcher, on the paths a GPU takes: the demo checkpoint
in bf16 with the CPU's compiled loops (numba) switched off; ``--backend triton`` runs the Triton
kernels in the interpreter (``TRITON_INTERPRET=1``). Ops the host runs on host data (the plan's
numpy) are not counted: only tensors. Run: ``python bench/host_syncs.py [--batch 4] [--steps 3]
[--backend torch|triton]``.
"""

from __future__ import annotations

import collections
import tempfile
import traceback
from pathlib import Path

import torch
from options import bench_parser
from torch.utils._python_dispatch import TorchDispatchMode

import dayzero.kernels.hyper as hyper
import dayzero.kernels.indexer_torch as indexer_torch
import dayzero.kernels.norms as norms
from dayzero.checkpoint import load_model
from dayzero.demo import write_demo_checkpoint
from dayzero.kv.pools import pools_for
from dayzero.model import forward
from dayzero.model.plan import AttentionOptions

ALWAYS = {"aten.item.default", "aten._local_scalar_dense.default", "aten.nonzero.default", "aten.bincount.default"}
ALWAYS |= {"aten.masked_select.default", "aten._unique2.default", "aten.unique_consecutive.default"}
ALWAYS |= {"aten.unique_dim.default", "aten.repeat_interleave.Tensor"}
BY_MASK = {"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default"}  # with a bool index


def _where() -> str:
    """The innermost dayzero line of the current call (outside this file)."""
    for frame in reversed(traceback.extract_stack()):
        if "/dayzero/" in frame.filename:
            return f"{frame.filename.split('/dayzero/')[-1]}:{frame.lineno}"
    return "(the decode loop's read of the step's tokens)"


class Syncs(TorchDispatchMode):
    """Counts each host-waiting operation by (source line, op)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: collections.Counter[tuple[str, str]] = collections.Counter()

    def __enter__(self):
        self._tolist = torch.Tensor.tolist  # a CPU tensor's tolist reads memory, bypassing the dispatcher

        def tolist(tensor: torch.Tensor):
            self.found[(_where(), "tolist")] += 1
            return self._tolist(tensor)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        masked = name in BY_MASK and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ()
        )
        if name in ALWAYS or masked:
            self.found[(_where(), name.removeprefix("aten.") + (" (bool index)" if masked else ""))] += 1
        return func(*args, **(kwargs or {}))


def gpu_paths() -> None:
    """Switch off the CPU's compiled loops: every op takes the path it takes on a GPU."""
    for module, name in ((norms, "fits_cpu"), (hyper, "fits_cpu"), (hyper, "FEW_TOKENS")):
        assert hasattr(module, name), f"{module.__name__}.{name} is gone: update this bench"
    norms.fits_cpu = hyper.fits_cpu = lambda t: False
    hyper.FEW_TOKENS = -1
    assert hasattr(indexer_torch, "weighted_relu_rows")
    indexer_torch.weighted_relu_rows = lambda heads, w, scale: torch.mv(heads.float().relu_(), w.float()).mul_(scale)


def prefilled_demo(batch: int, prompt_tokens: int, steps: int, backend: str, fp4: bool = True, device: str = "cpu"):
    """The demo checkpoint in bf16 on ``device`` with ``batch`` random prompts of about ``prompt_tokens``
    (each a little longer than the last) prefilled, room for ``steps`` decode steps: the model, its
    pools, the sequence ids, each sequence's next token and the attention options."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_demo_checkpoint(Path(tmp) / "demo", fp4=fp4)
        model = load_model(path, dtype=torch.bfloat16, device=device, progress=False)
    ids = [f"s{i}" for i in range(batch)]
    room = prompt_tokens + 64 * batch + steps
    pools = pools_for(model.cfg, torch.bfloat16, room, batch + 1, device=device)  # + a decode graph's pad
    lengths = [prompt_tokens + 37 * i for i in range(batch)]
    prompts = [torch.randint(2, model.cfg.vocab_size, (n,)).tolist() for n in lengths]
    options = AttentionOptions(backend=backend)
    tokens = forward.prefill(model, pools, ids, prompts, options).argmax(-1).tolist()
    return model, pools, ids, tokens, options


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="decode steps counted (a window closes every few)")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--backend", choices=("torch", "triton"), default="torch")
    parser.add_argument("--float-experts", action="store_true", help="bf16 experts (default: FP4, as released)")
    args = parser.parse_args()
    gpu_paths()
    model, pools, ids, tokens, options = prefilled_demo(
        args.batch, args.prompt_tokens, args.steps, args.backend, fp4=not args.float_experts
    )
    counter = Syncs()
    with counter:
        for _ in range(args.steps):
            logits = forward.decode(model, pools, ids, tokens, options)
            tokens = logits.argmax(-1).tolist()  # the loop's own read of the step's tokens: one per step
    layers = len(model.layers)
    experts = "bf16" if args.float_experts else "FP4"
    print(f"decode, batch {args.batch}, {args.steps} steps, demo checkpoint ({layers} layers, {experts} experts)")
    print(f"in bf16, backend {args.backend}")
    print("| where | op | per step |")
    print("|---|---|---:|")
    for (where, op), n in sorted(counter.found.items()):
        print(f"| {where} | {op} | {n / args.steps:g} |")
    print(f"| all | | {sum(counter.found.values()) / args.steps:g} |")


if __name__ == "__main__":
    main()
