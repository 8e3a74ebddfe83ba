// reference/moe.h
//
// Mixture of experts as the official MoE / Gate / Expert compute it (model.py):
//   gate    s = sqrt(softplus(x_fp32 . W_gate^T / gate_temp))                     [T, E] fp32
//           (softplus(v) = v for v > 20, else log1p(exp(v)), torch's threshold)
//           experts = top-k of (s + bias); tie rule: the lower expert index wins
//           w = s[experts] (unbiased), w /= (sum w + 1e-20) if norm_topk_prob and k > 1,
//           w *= route_scale
//   expert  g = float(w1(x)), u = float(w3(x)) (fp4 linears, bf16 outputs);
//           u = clamp(u, -limit, limit), g = min(g, limit) when swiglu_limit > 0;
//           h = silu(g) * u (fp32), h *= routing weight; out = w2(bf16(h)) (bf16)
//   MoE     y (fp32) = 0; for expert e = 0..E-1 in index order, for each token routed to e:
//           y += out_e; then y += shared_expert(x) (fp8 linears, no routing weight);
//           result bf16(y)
// The order of the fp32 additions is the official one (experts in index order, shared last).
//
// Example:
//   MoeOutput o = moe_forward(x, weights.blocks[2].ffn, config, /*layer=*/2);
#pragma once

#include <cstdint>
#include <vector>

#include "reference/config.h"
#include "reference/hooks.h"
#include "reference/tensor.h"
#include "reference/weights.h"

namespace dsv41::reference {

struct MoeRouting {
  Tensor<int32_t> experts;  // [T, k] chosen experts, by descending biased score
  Tensor<float> weights;    // [T, k] fp32 routing weights (unbiased, normalized, scaled)
  Tensor<float> scores;     // [T, E] fp32 unbiased gate scores sqrt(softplus(.))
};

// The official weights of a given expert choice: w = scores[experts], normalized by
// (sum + 1e-20) when norm_topk_prob and k > 1, times route_scale. Used again when a hook
// replaces the choice.
void moe_routing_weights(MoeRouting& r, const ModelConfig& c);

// x: [T, dim] bf16 -> routing of each token.
MoeRouting moe_gate(const Tensor<float>& x, const MoeWeights& w, const ModelConfig& c, int layer);

// One SwiGLU expert. x: [T, dim] bf16; routing_weight: [T] fp32 or nullptr -> [T, dim] bf16.
Tensor<float> expert_forward(const Tensor<float>& x, const LinearWeight& w1, const LinearWeight& w2,
                             const LinearWeight& w3, const float* routing_weight, double swiglu_limit);

struct MoeOutput {
  Tensor<float> y;   // [T, dim] bf16
  MoeRouting routing;
};

// x: [T, dim] bf16 (the ffn_norm output) -> [T, dim] bf16. hooks (optional) see and may replace
// the expert choice ("experts").
MoeOutput moe_forward(const Tensor<float>& x, const MoeWeights& w, const ModelConfig& c, int layer,
                      const ForwardHooks* hooks = nullptr);

}  // namespace dsv41::reference
