"""Speculative decoding with the checkpoint's MTP layer: draft up to k tokens per sequence,
verify them in one batched main-model pass over k + 1 tokens, keep the accepted prefix plus
the corrected (or bonus) token, undo the rest.

Per sequence between steps: the main model has committed positions 0..L-1, the pending token
(sampled, not yet fed) goes to position L, the MTP window holds positions 0..L-2 and the pools
keep the main streams of position L-1 (see ``KVPools.hidden``). A step:
  1. draft: the MTP layer at L-1 (pending streams, pending token) -> draft 1 (window row L-1 is
     final); again at L on its own output streams with draft 1 -> draft 2 (row L provisional);
  2. verify: the main model over [pending, drafts] at L..L+k; sample each row with the request's
     own parameters: greedy keeps a draft equal to the argmax, sampling keeps it with probability
     min(1, p/q) and replaces a rejected one from norm(max(0, p - q)) (the output follows p);
  3. commit the kept rows, put the rejected rows back (``kv.snapshot``; a rejected row that
     closed a compressor window: that window's entries and overlap too; the kept rows stay as
     the verify wrote them), return the blocks the step reserved beyond the kept length;
  4. catch the MTP window up over the accepted drafts and keep the new last position's streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .completion import Completion, Step, next_steps
from .kv.pools import KVPools
from .kv.snapshot import Snapshot
from .model.forward import decode, head, run_layers
from .model.mtp import follow, mtp_forward
from .model.plan import AttentionOptions, plan_step
from .model.vocab import lm_logits
from .model.weights import Transformer
from .sampling import NAN_LOGITS, distribution, draw, sample, verify_draft

Proposer = Callable[[list[str], list[list[int]]], list[list[int]]]  # (seq ids, MTP drafts) -> drafts


@dataclass(frozen=True, slots=True)
class Speculation:
    """``tokens``: drafts per step (1 or 2); ``propose``: replaces the MTP layer's draft tokens
    (a seam for tests that need drafts accepted or rejected on purpose; greedy requests only)."""

    tokens: int = 1
    propose: Proposer | None = None

    def __post_init__(self) -> None:
        if self.tokens not in (1, 2):
            raise ValueError("speculative decoding drafts 1 or 2 tokens per step")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One sequence's step: its tokens (or the exception its sampling raised), drafts made and kept."""

    steps: list[Step | Exception]
    drafted: int
    accepted: int


@dataclass(slots=True)
class Acceptance:
    """Drafts made and kept per draft position, over many steps (vLLM's spec_decode counters)."""

    drafted: list[int] = field(default_factory=lambda: [0, 0])
    accepted: list[int] = field(default_factory=lambda: [0, 0])
    steps: int = 0  # sequence-steps that drafted
    emitted: int = 0  # tokens those steps emitted

    def add(self, outcome: Outcome) -> None:
        if not outcome.drafted:
            return
        self.steps += 1
        self.emitted += outcome.accepted + 1
        for i in range(outcome.drafted):
            self.drafted[i] += 1
            self.accepted[i] += int(outcome.accepted > i)

    def merge(self, other: Acceptance) -> None:
        self.steps, self.emitted = self.steps + other.steps, self.emitted + other.emitted
        self.drafted = [a + b for a, b in zip(self.drafted, other.drafted, strict=True)]
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted, strict=True)]

    def counters(self) -> dict[str, float]:
        """Worker-stats counter increments (``dayzero_spec_decode_*``, see serving.metrics)."""
        per_position = {f"spec_accepted_pos_{i}": float(a) for i, a in enumerate(self.accepted)}
        return {
            "spec_drafts": float(self.steps),
            "spec_draft_tokens": float(sum(self.drafted)),
            "spec_accepted_tokens": float(sum(self.accepted)),
            **per_position,
        }

    def gauges(self) -> dict[str, float]:
        rate = sum(self.accepted) / sum(self.drafted) if sum(self.drafted) else 0.0
        return {
            "spec_acceptance_rate": rate,
            "spec_mean_accepted_length": self.emitted / self.steps if self.steps else 0.0,
        }

    def summary(self) -> dict[str, float | list[float]]:
        """Acceptance rate per draft position, and tokens per drafting step (1 + accepted drafts)."""
        rates = [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted, strict=True)]
        return {"acceptance_rate": rates, "mean_accepted_length": self.emitted / self.steps if self.steps else 0.0}


def _budget(completion: Completion, k: int) -> int:
    """Drafts worth making: none under a grammar (its mask applies token by token), and no more
    than the completion may still emit after the verified token."""
    return 0 if completion.guide is not None else max(0, min(k, completion.remaining() - 1))


def _draft(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    starts: list[int],
    pending: list[int],
    ks: list[int],
    completions: list[Completion],
    generators: list[torch.Generator | None],
    options: AttentionOptions,
) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """-> each sequence's drafts and the distribution [V] each was drawn from (the MTP's logits
    under the request's sampling parameters)."""
    drafts: list[list[int]] = [[] for _ in seq_ids]
    qs: list[list[torch.Tensor]] = [[] for _ in seq_ids]
    ks = list(ks)  # cut short for a sequence whose draft distribution has no mass
    plan = plan_step(model.cfg, pools, seq_ids, [L - 1 for L in starts], [[t] for t in pending], options)
    streams, hidden = mtp_forward(model, plan, pools, pools.hidden(seq_ids, model.head.weight.dtype))
    rows = list(range(len(seq_ids)))  # the sequence of each MTP output row
    for depth in range(max(ks, default=0)):
        logits = lm_logits(model, hidden).float()
        for r, s in enumerate(rows):
            if ks[s] > depth:
                c = completions[s]
                q = distribution(logits[r], c.params, c.counts)
                try:
                    token = int(q.argmax()) if c.params.greedy else draw(q, generators[s])
                except ValueError:  # NaN draft logits: no more drafts (its verify fails it if the model is NaN too)
                    ks[s] = depth
                    continue
                qs[s].append(q)
                drafts[s].append(token)
        further = [(r, s) for r, s in enumerate(rows) if ks[s] > depth + 1]
        if not further:
            break
        rows = [s for _, s in further]
        plan = plan_step(
            model.cfg,
            pools,
            [seq_ids[s] for s in rows],
            [starts[s] + depth for s in rows],
            [[drafts[s][depth]] for s in rows],
            options,
        )
        streams, hidden = mtp_forward(model, plan, pools, streams[[r for r, _ in further]])
    return drafts, qs


def _accept(
    completion: Completion,
    logits: torch.Tensor,
    nan: list[bool],
    drafts: list[int],
    qs: list[torch.Tensor],
    gen: torch.Generator | None,
) -> Outcome:
    """Walk one sequence's verified rows ``logits`` [k + 1, V] (``nan``: which hold a NaN): keep
    drafts while they pass, end at the first replacement, the bonus token after all k, or a
    finished completion."""
    if not drafts:  # a plain decode step (grammar masks included)
        return Outcome(next_steps([completion], logits[:1]), 0, 0)
    params, steps = completion.params, []
    try:
        for i, (token, q) in enumerate(zip(drafts, qs, strict=True)):
            if nan[i]:
                raise ValueError(NAN_LOGITS)
            p = distribution(logits[i], params, completion.counts)
            kept, token = verify_draft(p, q, token, params.greedy, gen)
            steps.append(completion.emit(token, logits[i]))
            if not kept or steps[-1].finish_reason:
                return Outcome(steps, len(drafts), i + int(kept))
        bonus = sample(logits[-1], params, gen, completion.counts)
        steps.append(completion.emit(bonus, logits[-1]))
    except Exception as exc:  # noqa: BLE001 - handed to the caller, which settles that request
        steps.append(exc)
    return Outcome(steps, len(drafts), len(steps) - 1)


def _settle(pools: KVPools, seq_ids: list[str], starts: list[int], kept: list[int], snap: Snapshot) -> None:
    """Commit each sequence's ``kept`` rows and undo the rest."""
    snap.restore([start + n for start, n in zip(starts, kept, strict=True)])
    for seq, n in zip(seq_ids, kept, strict=True):
        pools.commit(seq, n)


@torch.inference_mode()
def speculative_step(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    pending: list[int],
    completions: list[Completion],
    spec: Speculation,
    options: AttentionOptions = AttentionOptions(),
) -> list[Outcome]:
    """One step for every sequence: ``pending[s]`` is its sampled, not yet fed token; the pools
    need the MTP layer's state (``PoolLayout.of(..., mtp=True)``, filled by ``prefill``)."""
    if not pools.layout.mtp_layers or not model.mtp:
        raise ValueError("speculative decoding needs the checkpoint's MTP layer and pools holding its state")
    starts = [pools.length(s) for s in seq_ids]
    ks = [_budget(c, spec.tokens) for c in completions]
    added = [pools.reserve(s, L + k + 1) for s, L, k in zip(seq_ids, starts, ks, strict=True)]
    snap = Snapshot(pools, seq_ids, starts, [L + k + 1 for L, k in zip(starts, ks, strict=True)])
    generators = [c.generator() for c in completions]
    drafts, qs = _draft(model, pools, seq_ids, starts, pending, ks, completions, generators, options)
    if spec.propose is not None:
        drafts = spec.propose(seq_ids, drafts)
    chunks = [[t, *d] for t, d in zip(pending, drafts, strict=True)]
    plan = plan_step(model.cfg, pools, seq_ids, starts, chunks, options)
    streams = run_layers(model, plan, pools)
    logits = lm_logits(model, head(model, streams)).float()
    nan = torch.isnan(logits).any(dim=-1).tolist()  # one host read for every draft row of the batch
    outcomes = [
        _accept(c, logits[r : r + len(chunk)], nan[r : r + len(chunk)], d, q, g)
        for c, r, chunk, d, q, g in zip(completions, plan.batch.row0s, chunks, drafts, qs, generators, strict=True)
    ]
    kept = [o.accepted + 1 for o in outcomes]
    _settle(pools, seq_ids, starts, kept, snap)
    follow(model, pools, seq_ids, plan, streams, [d[: o.accepted] for d, o in zip(drafts, outcomes, strict=True)])
    for seq, blocks in zip(seq_ids, added, strict=True):
        pools.rollback(seq, blocks)
    return outcomes


def decode_round(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    pending: list[int],
    completions: list[Completion],
    spec: Speculation | None,
    options: AttentionOptions,
) -> tuple[list[list[Step | Exception]], Acceptance]:
    """One decode round of a batch: each sequence's new steps (one token, or a speculative run),
    and this round's draft counts."""
    acceptance = Acceptance()
    if spec is None:
        return [[s] for s in next_steps(completions, decode(model, pools, seq_ids, pending, options))], acceptance
    outcomes = speculative_step(model, pools, seq_ids, pending, completions, spec, options)
    for outcome in outcomes:
        acceptance.add(outcome)
    return [o.steps for o in outcomes], acceptance
