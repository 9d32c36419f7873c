"""Compare dayzero with transformers' DeepseekV4ForCausalLM on the same checkpoint (fp32)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .checkpoint import load_model
from .kv.pools import pools_for
from .model.forward import decode, prefill, score
from .model.plan import AttentionOptions

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
    tolerance: float = ABS_TOLERANCE

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
    return DeepseekV4ForCausalLM.from_pretrained(str(path), dtype=torch.float32, **extra).eval()


@torch.inference_mode()
def align(
    path: str | Path, prompt: list[int], tokens: int = 8, options: AttentionOptions = AttentionOptions()
) -> AlignReport:
    path = Path(path)
    ref, ours = reference_model(path), load_model(path, progress=False)
    ids = torch.tensor([prompt])
    out = ref(ids, output_hidden_states=True)
    capture: list[torch.Tensor] = []
    pools = pools_for(ours.cfg, torch.float32, len(prompt) + tokens, max_sequences=2)
    logits = score(ours, pools, "full", prompt, options, capture)
    dense_options = AttentionOptions(options.backend, sparse=not options.sparse)
    other = score(ours, pools_for(ours.cfg, torch.float32, len(prompt)), "dense", prompt, dense_options)
    sparse_shift = (logits - other).abs().max().item()
    diff = (logits - out.logits[0]).abs()
    rel = (diff / out.logits[0].abs().clamp_min(1e-6)).max().item()
    # transformers records the embeddings, each layer's streams but the last, then the final hidden
    hidden_ref = [h[0] for h in out.hidden_states[1:]]
    ours_hidden = [*capture[:-2], capture[-1]]
    layers = [(a - b).abs().max().item() for a, b in zip(ours_hidden, hidden_ref, strict=True)]

    # dayzero decodes incrementally from its attention state; the reference re-runs the
    # whole sequence each step (its forward over the full sequence is the spec)
    sequence = list(prompt)
    ref_logits = out.logits[0, -1]
    our_logits = prefill(ours, pools, ["steps"], [prompt], options)[0]
    steps, match = [], True
    for step in range(tokens):
        err = (ref_logits - our_logits).abs().max().item()
        ref_tok, our_tok = int(ref_logits.argmax()), int(our_logits.argmax())
        steps.append(StepReport(step, ref_tok, our_tok, err))
        if ref_tok != our_tok:
            match = False
            break
        sequence.append(ref_tok)
        ref_logits = ref(torch.tensor([sequence])).logits[0, -1]
        our_logits = decode(ours, pools, ["steps"], [our_tok], options)[0]
    return AlignReport(len(prompt), diff.max().item(), rel, layers, match, steps, sparse_shift)
