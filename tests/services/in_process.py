"""The references the pipeline tests compare a stack with: dayzero's engine run in-process on
the same checkpoint (no queue, no handoff)."""

from __future__ import annotations

import functools


@functools.cache
def _loaded(checkpoint, device: str):
    from dayzero.checkpoint import load_model
    from dayzero.tokenizer import TextCodec

    return load_model(checkpoint, device=device, progress=False), TextCodec.from_checkpoint(checkpoint)


def engine_steps(checkpoint, ids: list[int], params, device: str = "cpu", backend: str = "torch") -> list:
    """The steps of ``checkpoint`` completing ``ids``, run in-process by dayzero's engine (no
    queue, no handoff)."""
    import torch

    from dayzero.engine import generate
    from dayzero.kv.pools import pools_for
    from dayzero.model.plan import AttentionOptions

    model, codec = _loaded(checkpoint, device)
    pools = pools_for(model.cfg, torch.float32, len(ids) + params.max_tokens, device=device)
    return list(generate(model, codec, pools, ids, params, options=AttentionOptions(backend=backend)))


def engine_completer(checkpoint, device: str, backend: str = "torch"):
    """Greedy completion texts of ``checkpoint`` from the in-process engine."""
    from dayzero.sampling import SamplingParams

    def complete(ids: list[int], max_tokens: int, **sampling) -> str:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
        return "".join(step.text for step in engine_steps(checkpoint, ids, params, device, backend))

    return complete
