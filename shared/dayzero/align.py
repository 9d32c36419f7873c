"""Compare dayzero with transformers' DeepseekV4ForCausalLM on the same checkpoint (fp32).

Exact ties among indexer scores (every head's ReLU at zero, common on tiny random checkpoints
with few indexer heads) leave torch's ``topk`` free to pick any of the tied entries, while
dayzero picks the earliest. Fidelity is therefore judged against the reference with its ties
broken the same way (``EarliestTies``); the plain reference's error is reported beside it,
with how many indexer queries had a tie at the top-k boundary.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .checkpoint import load_model
from .kv.pools import pools_for
from .model.forward import decode, prefill, score
from .model.plan import AttentionOptions
from .parallel import Group
from .parallel.group import run_group
from .parallel.launch import Launch

# fp32 on both sides, same op order up to reductions: differences are rounding (~1e-6);
# 1e-4 absolute leaves room for long sequences without hiding a wrong mask or state.
ABS_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class StepReport:
    step: int
    reference_token: int
    dayzero_token: int
    max_abs_err: float


@dataclass(frozen=True, slots=True)
class AlignReport:
    prompt_tokens: int
    max_abs_err: float
    max_rel_err: float
    layers: list[float]  # max abs error of each layer's residual streams (last: final hidden)
    greedy_match: bool
    steps: list[StepReport]
    sparse_vs_dense_max_abs: float  # how far CSA top-k selection moves the prompt logits (dayzero only)
    plain_max_abs_err: float  # against the reference with torch's own tie order
    tied_queries: int  # indexer queries (x CSA layers) of the prompt with a tie at the top-k boundary
    indexer_queries: int
    tolerance: float = field(default=ABS_TOLERANCE)

    @property
    def ok(self) -> bool:
        step_errs = [s.max_abs_err for s in self.steps]
        return self.greedy_match and max([self.max_abs_err, *step_errs]) <= self.tolerance

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def reference_model(path: Path):
    """transformers' model on the checkpoint, fp32; FP4/FP8 checkpoints dequantized as they load."""
    import json

    from transformers import DeepseekV4ForCausalLM, FineGrainedFP8Config

    quant = json.loads((path / "config.json").read_text()).get("quantization_config")
    extra = {}
    if quant:
        extra["quantization_config"] = FineGrainedFP8Config(
            dequantize=True, expert_dtype=quant.get("expert_dtype", "fp8"), scale_fmt=quant.get("scale_fmt", "float")
        )
    report_log, tower_hidden = logging.getLogger("transformers.modeling_utils"), TowerRowsHidden()
    report_log.addFilter(tower_hidden)
    try:
        return DeepseekV4ForCausalLM.from_pretrained(str(path), dtype=torch.float32, **extra).eval()
    finally:
        report_log.removeFilter(tower_hidden)


class TowerRowsHidden(logging.Filter):
    """transformers' load report less its rows of the vision tower (``visual.*``: no part of the text
    model, UNEXPECTED on every checkpoint with a tower), and none of it when those were all its rows.
    A filter on the report, not a subclass of the model ignoring the keys: transformers' save_pretrained
    of any subclass wrote the published names half-converted (dc9d02e)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if " LOAD REPORT" not in text:
            return True
        # the title, the table's header and rule, its rows, a blank line, the notes
        lines = [line for line in text.split("\n") if not line.startswith("visual.")]
        rows = lines[3 : lines.index("")]
        if not rows:
            return False
        if not any("UNEXPECTED" in row for row in rows):  # its note explained the tower's rows alone
            lines = [line for line in lines if "UNEXPECTED:" not in line]
        record.msg, record.args = "\n".join(lines), ()
        return True


class EarliestTies:
    """While the reference's indexers run, ``Tensor.topk`` keeps tied scores in entry order (as
    dayzero does) and counts the query rows whose k-th and (k+1)-th finite scores tie."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True) -> None:
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer

        self.indexers = [m for m in model.modules() if isinstance(m, DeepseekV4Indexer)]
        self.enabled, self.tied, self.rows = enabled, 0, 0
        self._saved = torch.Tensor.topk

    def _topk(self, scores: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
        ordered, order = torch.sort(scores, dim=dim, descending=largest, stable=True)
        if k < scores.shape[dim]:
            kth, next_ = ordered.narrow(dim, k - 1, 1), ordered.narrow(dim, k, 1)
            self.tied += int(((kth == next_) & torch.isfinite(kth)).sum())
        self.rows += scores.numel() // max(scores.shape[dim], 1)
        if not self.enabled:
            return self._saved(scores, k, dim, largest, sorted)
        return torch.return_types.topk((ordered.narrow(dim, 0, k), order.narrow(dim, 0, k)))

    def __enter__(self) -> EarliestTies:
        self._hooks = ExitStack()
        patched = lambda scores, *args, **kwargs: self._topk(scores, *args, **kwargs)  # binds as a method
        install = lambda *_: setattr(torch.Tensor, "topk", patched)
        restore = lambda *_: setattr(torch.Tensor, "topk", self._saved)
        for m in self.indexers:
            self._hooks.callback(m.register_forward_pre_hook(install).remove)
            self._hooks.callback(m.register_forward_hook(restore).remove)
        return self

    def __exit__(self, *exc: object) -> None:
        torch.Tensor.topk = self._saved
        self._hooks.close()


@dataclass(slots=True)
class OurRun:
    """dayzero's side of a comparison: prompt logits [L, V], each layer's streams, the same with
    CSA selection switched, and the logits of each greedy decode step (its own tokens fed back)."""

    logits: torch.Tensor
    capture: list[torch.Tensor]
    other: torch.Tensor
    step_logits: list[torch.Tensor]


@torch.inference_mode()
def our_run(group: Group, path: Path, prompt: list[int], tokens: int, options: AttentionOptions) -> OurRun:
    """Run on every rank of ``group`` (dayzero.parallel.group.run_group); rank 0's result is used."""
    ours = load_model(path, progress=False, group=group)
    capture: list[torch.Tensor] = []
    pools = pools_for(ours.cfg, torch.float32, len(prompt) + tokens, max_sequences=2)
    logits = score(ours, pools, "full", prompt, options, capture)
    dense_options = AttentionOptions(options.backend, sparse=not options.sparse)
    other = score(ours, pools_for(ours.cfg, torch.float32, len(prompt)), "dense", prompt, dense_options)
    steps = [prefill(ours, pools, ["steps"], [prompt], options)[0]]
    for _ in range(tokens - 1):
        steps.append(decode(ours, pools, ["steps"], [int(steps[-1].argmax())], options)[0])
    return OurRun(logits, capture, other, steps[:tokens])


@torch.inference_mode()
def align(
    path: str | Path,
    prompt: list[int],
    tokens: int = 8,
    options: AttentionOptions = AttentionOptions(),
    tensor_parallel: int = 1,
    launch: Launch | None = None,
) -> AlignReport:
    """``tensor_parallel`` > 1: dayzero's side runs on that many gloo ranks, local ones or, with
    ``launch``, the group this process joins as one rank (each rank then compares on its own)."""
    path = Path(path)
    ours = run_group(tensor_parallel, our_run, path, prompt, tokens, options, launch=launch)
    ref = reference_model(path)
    ids = torch.tensor([prompt])
    with EarliestTies(ref, enabled=False) as plain:
        plain_logits = ref(ids).logits[0]
    with EarliestTies(ref):
        out = ref(ids, output_hidden_states=True)
    sparse_shift = (ours.logits - ours.other).abs().max().item()
    diff = (ours.logits - out.logits[0]).abs()
    rel = (diff / out.logits[0].abs().clamp_min(1e-6)).max().item()
    # transformers records the embeddings, each layer's streams but the last, then the final hidden
    hidden_ref = [h[0] for h in out.hidden_states[1:]]
    ours_hidden = [*ours.capture[:-2], ours.capture[-1]]
    layers = [(a - b).abs().max().item() for a, b in zip(ours_hidden, hidden_ref, strict=True)]
    steps, match = _steps(ref, prompt, out.logits[0, -1], ours.step_logits)
    plain_err = (ours.logits - plain_logits).abs().max().item()
    return AlignReport(
        len(prompt), diff.max().item(), rel, layers, match, steps, sparse_shift, plain_err, plain.tied, plain.rows
    )


def _steps(ref, prompt: list[int], ref_logits: torch.Tensor, ours: list[torch.Tensor]) -> tuple[list[StepReport], bool]:
    """dayzero decodes incrementally from its attention state; the reference re-runs the whole
    sequence each step (its forward over the full sequence is the spec), until the tokens differ."""
    sequence, steps = list(prompt), []
    for step, our_logits in enumerate(ours):
        err = (ref_logits - our_logits).abs().max().item()
        ref_tok, our_tok = int(ref_logits.argmax()), int(our_logits.argmax())
        steps.append(StepReport(step, ref_tok, our_tok, err))
        if ref_tok != our_tok:
            return steps, False
        sequence.append(ref_tok)
        if step + 1 < len(ours):
            with EarliestTies(ref):
                ref_logits = ref(torch.tensor([sequence])).logits[0, -1]
    return steps, True
