"""A sequence whose logits turn NaN (a diverged model) under speculation fails alone, as it does in
plain decoding, and emits no token drawn from them; NaN draft logits cost only that round's drafts.

Greedy verify took the argmax of a NaN row (a NaN's position) as the model's token, and sampled
verify kept every draft (min(1, p/q) is 1 when p/q is NaN): tokens were streamed from NaN rows. A
sampled draft whose MTP distribution had no mass raised out of the draft pass and failed the batch.
"""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.completion import Completion, next_steps
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill
from dayzero.sampling import SamplingParams
from dayzero.speculative import Speculation, speculative_step

from .conftest import random_ids

IDS = ["ok", "nan"]


@pytest.fixture(scope="module")
def model(mtp_checkpoint):
    return load_model(mtp_checkpoint, progress=False)


def _prefilled(model, params: SamplingParams, poison: str | None):
    """Two sequences prefilled; ``poison``: NaN into the second's main-layer window ("window": its
    model logits turn NaN) or into the streams its MTP layer drafts from ("mtp")."""
    prompts = [random_ids(n, model.cfg.vocab_size, seed=n) for n in (11, 7)]
    pools = pools_for(model.cfg, torch.float32, 64, max_sequences=2, mtp=True)
    completions = [Completion(IdsOnlyCodec(), params, (), len(p), 1 << 20) for p in prompts]
    pending = [c.next(row).token for c, row in zip(completions, prefill(model, pools, IDS, prompts), strict=True)]
    tables = pools.sequences["nan"].tables
    if poison == "window":
        pools.window[: model.cfg.num_layers, tables["window"]] = float("nan")
    elif poison == "mtp":
        pools.compressor["mtp_hidden"][:, tables["compressor"][0]] = float("nan")
    return pools, completions, pending


def _tokens(steps) -> list:
    return [type(s) if isinstance(s, Exception) else s.token for s in steps]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("poison", ["window", "mtp"])
def test_nan_logits_fail_their_sequence_alone(model, temperature, poison):
    params = SamplingParams(max_tokens=8, temperature=temperature, seed=5 if temperature else None, ignore_eos=True)
    pools, completions, pending = _prefilled(model, params, None)
    clean = speculative_step(model, pools, IDS, pending, completions, Speculation(2))
    pools, completions, pending = _prefilled(model, params, poison)
    got = speculative_step(model, pools, IDS, pending, completions, Speculation(2))
    assert _tokens(got[0].steps) == _tokens(clean[0].steps)  # the other sequence: as in a clean batch
    pools, completions, pending = _prefilled(model, params, poison)
    plain = next_steps(completions, decode(model, pools, IDS, pending))  # the reference: no speculation
    if poison == "window":
        assert isinstance(plain[1], ValueError)
        assert _tokens(got[1].steps) == [ValueError]  # no token from the NaN row, then the failure
    else:  # the model's own logits are sound: its plain step, without drafts
        assert not isinstance(plain[1], Exception)
        assert all(isinstance(s.token, int) for s in got[1].steps)
        assert temperature == 0.0 or (got[1].drafted, len(got[1].steps)) == (0, 1)
