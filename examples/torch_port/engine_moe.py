"""The engine's MoE (model.layers.N.ffn) in torch: the gate's routing and the experts' combination.

Semantics (reference/ops/moe.h, docs/numerics.md): logits = x @ gate^T in fp32; scores =
sqrt(softplus(logits / gate_temp)); the top-k of scores + bias, descending, the lower expert first
among equal values; weights = the chosen scores, divided by their sum (+ 1e-20) when norm_topk_prob,
times route_scale. Each routed expert e runs its tokens: g = w1(x), u = w3(x) (bf16), u clamped to
+-swiglu_limit and g to <= swiglu_limit, h = bf16(weight * silu(g) * u), y_e = w2(h); the outputs
accumulate in fp32 in expert order; the shared expert the same without a weight; out = bf16(acc +
shared).

In torch: the gate, the routing, the SwiGLU, the accumulation. Through dsv41.ops (torch 1.13 has no
float4 / float8): the expert and shared-expert linears (fp4 / fp8 weights as stored).
"""
import torch
from torch import nn

from engine_attention import Linear


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


class Gate(nn.Module):
    """model.layers.N.ffn.gate: returns (weights [T, k] fp32, experts [T, k] int32)."""

    def __init__(self, weights, layer, c):
        super().__init__()
        p = f"layers.{layer}.ffn.gate."
        self.weight = torch.from_numpy(weights.tensor(p + "weight"))      # [E, dim] bf16 values
        self.bias = torch.from_numpy(weights.tensor(p + "bias"))          # [E] fp32
        self.k = c["n_activated_experts"]
        self.temp, self.norm, self.scale = c["gate_temp"], c["norm_topk_prob"], c["route_scale"]

    def forward(self, x):
        logits = (x @ self.weight.T) / self.temp                          # [T, E] fp32
        sp = torch.where(logits > 20.0, logits, torch.log1p(torch.exp(logits)))
        scores = torch.sqrt(sp)
        order = torch.sort(scores + self.bias, dim=-1, descending=True, stable=True).indices
        experts = order[:, :self.k]
        w = scores.gather(1, experts)
        if self.norm and self.k > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.scale, experts.to(torch.int32)


class Expert(nn.Module):
    def __init__(self, weights, prefix, limit):
        super().__init__()
        self.w1, self.w2, self.w3 = (Linear(weights, f"{prefix}.{n}") for n in ("w1", "w2", "w3"))
        self.limit = limit

    def forward(self, x, routing_weight=None):
        g, u = self.w1(x), self.w3(x)                                     # [n, inter] bf16
        if self.limit > 0:
            u = u.clamp(-self.limit, self.limit)
            g = g.clamp(max=self.limit)
        h = torch.nn.functional.silu(g) * u
        if routing_weight is not None:
            h = routing_weight[:, None] * h
        return self.w2(bf16(h))                                           # [n, dim] bf16


class MoE(nn.Module):
    """model.layers.N.ffn (vLLM: DeepseekV4MoE with gate, experts, shared_experts)."""

    def __init__(self, weights, layer, c):
        super().__init__()
        p = f"layers.{layer}.ffn"
        self.gate = Gate(weights, layer, c)
        self.experts = nn.ModuleList(Expert(weights, f"{p}.experts.{e}", c["swiglu_limit"])
                                     for e in range(c["n_routed_experts"]))
        self.shared_experts = Expert(weights, f"{p}.shared_experts", c["swiglu_limit"])

    def forward(self, x):
        w, experts = self.gate(x)
        acc = torch.zeros_like(x)                                         # fp32
        for e, expert in enumerate(self.experts):
            tok, slot = (experts == e).nonzero(as_tuple=True)             # ascending token order
            if tok.numel() == 0:
                continue
            y = expert(x[tok], w[tok, slot])
            acc.index_add_(0, tok, y)
        return bf16(acc + self.shared_experts(x))



