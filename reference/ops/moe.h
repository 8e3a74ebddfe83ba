// reference/ops/moe.h
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
//   MoeRouting r = moe_gate(x, weights.blocks[2].ffn, config, /*layer=*/2);
//   // (the model shows r.experts to its hooks here; a replacement calls moe_routing_weights)
//   Tensor<float> y = moe_experts(x, weights.blocks[2].ffn, r, config);
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/linear.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference {

// One layer's MoE weights (checkpoint prefix P = "layers.<L>.ffn." or "mtp.<i>.ffn.").
struct MoeWeights {
  LinearWeight gate;                     // P "gate": BF16 [E, dim], used as fp32
  Tensor<float> gate_bias;               // P "gate.bias": [E] fp32
  std::vector<LinearWeight> w1, w2, w3;  // P "experts.<e>.w1/w2/w3": routed experts, F4
  LinearWeight s_w1, s_w2, s_w3;         // P "shared_experts.w1/w2/w3": the shared expert, F8
};

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

// The pieces of moe_gate and expert_forward that device backends run on the host (their exp and
// log are glibc's: cuda/cuda_ops_moe.cc):
//   moe_activated_experts  k of the layer (DSpark blocks: dspark_n_activated_experts when set)
//   moe_route              moe_gate after its GEMM: logits [T, E] fp32 -> scores, the biased stable
//                          sort (ties: lower expert index), routing weights
//   swiglu                 expert_forward between its GEMMs: g = w1(x), u = w3(x) [T, inter] bf16,
//                          routing_weight [T] fp32 or nullptr -> h [T, inter] bf16
int moe_activated_experts(const ModelConfig& c, int layer);
MoeRouting moe_route(const Tensor<float>& logits, const MoeWeights& w, const ModelConfig& c, int layer);
Tensor<float> swiglu(const Tensor<float>& g, const Tensor<float>& u, const float* routing_weight, double swiglu_limit);

// The tokens routed to expert e, in token order, with their routing weights, and their rows of x:
//   x: [T, dim] -> rows [tokens, dim] (x's rows in `tokens` order).
struct ExpertBatch {
  std::vector<int64_t> tokens;
  std::vector<float> weights;
  Tensor<float> rows;
};
ExpertBatch expert_batch(const Tensor<float>& x, const MoeRouting& routing, int e);

// The linear an expert's three projections run through: reference::linear, or an order-variant
// backend's own (scenarios/defects/reordered_ops.cc: the tensor-core emulation runs the shared
// expert's F8 linears through its block dot, as the production CUDA linear does).
using ExpertLinear = std::function<Tensor<float>(const Tensor<float>&, const LinearWeight&)>;

// One SwiGLU expert. x: [T, dim] bf16; routing_weight: [T] fp32 or nullptr -> [T, dim] bf16.
Tensor<float> expert_forward(const Tensor<float>& x, const LinearWeight& w1, const LinearWeight& w2,
                             const LinearWeight& w3, const float* routing_weight, double swiglu_limit,
                             const ExpertLinear& lin = {});

// The routed experts (each token through its experts, weighted) plus the shared expert, summed in
// the official order above. x: [T, dim] bf16 -> [T, dim] bf16. lin: the experts' linear (empty:
// reference::linear).
Tensor<float> moe_experts(const Tensor<float>& x, const MoeWeights& w, const MoeRouting& routing,
                          const ModelConfig& c, const ExpertLinear& lin = {});

}  // namespace dsv41::reference
