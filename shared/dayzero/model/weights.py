"""Weight containers named exactly like DeepSeek's published checkpoints.

The module tree mirrors the tensor names (``layers.N.attn.wq_a.weight``,
``layers.N.attn.indexer.compressor.ape``, ``hc_head_fn`` ...), so loading is a name
check plus an assignment. Routed experts are stacked at load time into
``ffn.experts.w1 [E, I, H]``, ``w2 [E, H, I]``, ``w3 [E, I, H]``. The modules hold
weights only; the forward functions live beside them in this package.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import CSA, SLIDING, ModelConfig
from ..kernels.batch import Backend, kept_view
from ..kernels.expert_mlp import expert_mlp, expert_mlp_stacked, pads_cheaply
from ..parallel import Group
from ..quant.experts import PackedExperts

# Parameters that stay fp32 whatever the serving dtype (as in the reference).
FP32_SUFFIXES = ("_fn", "_base", "_scale", "attn_sink", "ape", "gate.bias", "norm.weight")


def _param(*shape: int, dtype: torch.dtype = torch.float32) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False).requires_grad_(False)


class Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = _param(dim)


class Compressor(nn.Module):
    """``wkv`` / ``wgate`` project each token to ``width`` (2*dim with overlap, else dim)."""

    def __init__(self, hidden: int, dim: int, rate: int, overlap: bool) -> None:
        super().__init__()
        width = 2 * dim if overlap else dim
        self.wkv = _linear(hidden, width)
        self.wgate = _linear(hidden, width)
        self.ape = _param(rate, width)
        self.norm = Norm(dim)


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, rate: int) -> None:
        super().__init__()
        self.wq_b = _linear(cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim)
        self.weights_proj = _linear(cfg.hidden_size, cfg.index_n_heads)
        self.compressor = Compressor(cfg.hidden_size, cfg.index_head_dim, rate, overlap=True)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        kind, rate = cfg.layer_type(layer), cfg.compress_rate(layer)
        self.wq_a = _linear(cfg.hidden_size, cfg.q_lora_rank)
        self.q_norm = Norm(cfg.q_lora_rank)
        self.wq_b = _linear(cfg.q_lora_rank, cfg.num_heads * cfg.head_dim)
        self.wkv = _linear(cfg.hidden_size, cfg.head_dim)
        self.norm = Norm(cfg.head_dim)
        self.wo_a = _linear(cfg.num_heads * cfg.head_dim // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank)
        self.wo_b = _linear(cfg.o_groups * cfg.o_lora_rank, cfg.hidden_size)
        self.attn_sink = _param(cfg.num_heads)
        if kind != SLIDING:
            self.compressor = Compressor(cfg.hidden_size, cfg.head_dim, rate, overlap=kind == CSA)
        if kind == CSA:
            self.indexer = Indexer(cfg, rate)


class Gate(nn.Module):
    def __init__(self, cfg: ModelConfig, hashed: bool) -> None:
        super().__init__()
        self.weight = _param(cfg.n_routed_experts, cfg.hidden_size)
        if hashed:
            self.register_buffer("tid2eid", torch.empty(cfg.vocab_size, cfg.num_experts_per_tok, dtype=torch.long))
        else:
            self.bias = _param(cfg.n_routed_experts)


class Experts(nn.Module):
    """Routed experts as float weights [E, rows, cols] (the MoE's RoutedExperts)."""

    def __init__(self, n: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.w1 = _param(n, inter, hidden)  # gate
        self.w2 = _param(n, hidden, inter)  # down
        self.w3 = _param(n, inter, hidden)  # up

    def run(self, xs: torch.Tensor, counts: torch.Tensor, most: int, limit: float, backend: Backend) -> torch.Tensor:
        if backend == "triton":  # padded to the bound, the routing never read back: a GPU step stays capturable
            return expert_mlp_stacked(xs, counts, most, self.w1, self.w2, self.w3, limit)
        sizes = counts.tolist()  # the one read of the step's routing to the host
        if pads_cheaply(sizes, *self.w1.shape[1:]):
            return expert_mlp_stacked(xs, counts, max(sizes), self.w1, self.w2, self.w3, limit)
        each = self._each_expert()
        return expert_mlp(xs, sizes, lambda ids: {e: each[e] for e in ids}, limit)

    def _each_expert(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each expert's (w1, w2, w3) views, made once and kept with the memory they view (``w1[e]``
        is an aten op: three an expert a step, ~24 a demo decode step); weights given new memory
        (``param.data = ...``, a move) are viewed afresh."""
        weights = (self.w1, self.w2, self.w3)
        return kept_view(self, "_views", weights, lambda: list(zip(*(w.unbind(0) for w in weights), strict=True)))


class SharedExpert(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.w1 = _linear(hidden, inter)
        self.w2 = _linear(inter, hidden)
        self.w3 = _linear(hidden, inter)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, packed: bool) -> None:
        super().__init__()
        self.gate = Gate(cfg, hashed=cfg.hashed_moe(layer))
        kind = PackedExperts if packed else Experts
        self.experts = kind(cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_experts = SharedExpert(cfg.hidden_size, cfg.moe_intermediate_size)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, packed: bool) -> None:
        super().__init__()
        n_mix, width = (2 + cfg.hc_mult) * cfg.hc_mult, cfg.hc_mult * cfg.hidden_size
        self.attn = Attention(cfg, layer)
        self.ffn = MoE(cfg, layer, packed)
        self.attn_norm = Norm(cfg.hidden_size)
        self.ffn_norm = Norm(cfg.hidden_size)
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = _param(n_mix, width), _param(n_mix), _param(3)
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = _param(n_mix, width), _param(n_mix), _param(3)


def _hc_head(cfg: ModelConfig) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
    """``hc_head_{fn,base,scale}``: collapse the hyper-connection streams before the final norm."""
    return _param(cfg.hc_mult, cfg.hc_mult * cfg.hidden_size), _param(cfg.hc_mult), _param(1)


class MTPBlock(Block):
    """One multi-token-prediction layer (``mtp.N.*``, DeepSeek's MTPBlock): a decoder block numbered
    after the main layers (sliding attention, score-routed MoE), fed ``e_proj(enorm(embed(next)))
    + h_proj(hnorm(h))``, with its own norm and hyper-connection head; embedding and head shared."""

    def __init__(self, cfg: ModelConfig, index: int, packed: bool) -> None:
        super().__init__(cfg, cfg.num_layers + index, packed)
        self.e_proj = _linear(cfg.hidden_size, cfg.hidden_size)
        self.h_proj = _linear(cfg.hidden_size, cfg.hidden_size)
        self.enorm, self.hnorm, self.norm = Norm(cfg.hidden_size), Norm(cfg.hidden_size), Norm(cfg.hidden_size)
        self.hc_head_fn, self.hc_head_base, self.hc_head_scale = _hc_head(cfg)


class Transformer(nn.Module):
    """``packed_experts``: routed experts stay MXFP4 (see dayzero.quant.experts); ``mtp_layers``: how
    many ``mtp.N`` layers the checkpoint ships (loaded for speculative decoding, unused by the forward).
    A tensor-parallel rank holds its own slices of the split tensors (dayzero.parallel.shard)."""

    def __init__(self, cfg: ModelConfig, packed_experts: bool = False, mtp_layers: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        rows = torch.empty(cfg.vocab_size, cfg.hidden_size)  # given: no random init (on meta it imports dynamo: ~2.5 s)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=rows, _freeze=True)
        self.layers = nn.ModuleList(Block(cfg, i, packed_experts) for i in range(cfg.num_layers))
        self.norm = Norm(cfg.hidden_size)
        self.head = _linear(cfg.hidden_size, cfg.vocab_size)
        self.hc_head_fn, self.hc_head_base, self.hc_head_scale = _hc_head(cfg)
        self.mtp = nn.ModuleList(MTPBlock(cfg, i, packed_experts) for i in range(mtp_layers))
        self.comm = Group()  # one rank; the loader installs the group a split model runs over


def pin_attributes(model: nn.Module) -> None:
    """Put every submodule and parameter in its owner's instance dict, where attribute lookup finds
    it without ``nn.Module.__getattr__`` (a decode step reads ~250 of them through it: ~10% of a
    step of the demo model on CPU). Call once the tree is complete: assigning a module or a
    Parameter afterwards still works (``nn.Module.__setattr__`` drops the pinned entry), and a
    move between devices keeps the same objects; buffers are left alone (``Module.to`` replaces them)."""
    for module in model.modules():
        for store in (module._modules, module._parameters):
            module.__dict__.update((name, value) for name, value in store.items() if value is not None)


def is_fp32_param(name: str) -> bool:
    return name.endswith(FP32_SUFFIXES)


def held_dtype(name: str, laid_out: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """The dtype the loader holds tensor ``name`` in (``laid_out``: the skeleton's): an integer one
    (packed experts and their scales, the hash-routing table) as laid out, an fp32 parameter
    (``is_fp32_param``: norms, hyper-connections, sinks, biases) in fp32, the rest in ``dtype``
    (DAYZERO_DTYPE)."""
    if not laid_out.is_floating_point:
        return laid_out
    return torch.float32 if is_fp32_param(name) else dtype


def skeleton(cfg: ModelConfig, packed_experts: bool = False, mtp_layers: int = 0) -> Transformer:
    """The module tree on the meta device: names, shapes, no memory."""
    with torch.device("meta"):
        return Transformer(cfg, packed_experts, mtp_layers)
