#include "reference/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "reference/ops/linear.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference {
namespace {

// torch.nn.functional.softplus(v), beta 1, threshold 20, in fp32.
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// torch's silu on fp32: v / (1 + exp(-v)).
float silu(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

int moe_activated_experts(const ModelConfig& c, int layer) {
  return layer < c.n_layers || c.dspark_n_activated_experts == 0 ? c.n_activated_experts
                                                                 : c.dspark_n_activated_experts;
}

void moe_routing_weights(MoeRouting& r, const ModelConfig& c) {
  const int64_t T = r.experts.dim(0), k = r.experts.dim(1), E = r.scores.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = r.experts.at(t, j);
      DSV41_CHECK(e >= 0 && e < E, "token ", t, ": expert ", e, " outside [0, ", E, ")");
      sum += r.scores.at(t, e);
    }
    for (int64_t j = 0; j < k; ++j) {
      float wt = r.scores.at(t, r.experts.at(t, j));
      if (c.norm_topk_prob && k > 1) wt /= (sum + 1e-20f);
      wt *= static_cast<float>(c.route_scale);
      r.weights.at(t, j) = wt;
    }
  }
}

MoeRouting moe_gate(const Tensor<float>& x, const MoeWeights& w, const ModelConfig& c, int layer) {
  DSV41_CHECK(c.score_func == ScoreFunc::kSqrtSoftplus, "layer ", layer,
              ": only score_func sqrtsoftplus (the released one) is implemented, got ", name(c.score_func));
  return moe_route(linear_fp32(x, w.gate), w, c, layer);  // logits [T, E] fp32
}

MoeRouting moe_route(const Tensor<float>& logits, const MoeWeights& w, const ModelConfig& c, int layer) {
  const int64_t T = logits.dim(0);
  const int E = static_cast<int>(w.gate.out);
  const int k = moe_activated_experts(c, layer);
  MoeRouting r{Tensor<int32_t>({T, k}, "moe.experts"), Tensor<float>({T, k}, "moe.weights"),
               Tensor<float>({T, E}, "moe.scores")};
  const float temp = static_cast<float>(c.gate_temp);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> biased(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      r.scores.at(t, e) = std::sqrt(softplus(logits.at(t, e) / temp));
      biased[e] = r.scores.at(t, e) + w.gate_bias.data()[static_cast<size_t>(e)];
    }
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    // Descending biased score; among equal scores the lower expert index first.
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return biased[a] > biased[b]; });
    for (int j = 0; j < k; ++j) r.experts.at(t, j) = order[j];
  }
  moe_routing_weights(r, c);
  return r;
}

Tensor<float> expert_forward(const Tensor<float>& x, const LinearWeight& w1, const LinearWeight& w2,
                             const LinearWeight& w3, const float* routing_weight, double swiglu_limit,
                             const ExpertLinear& lin) {
  const auto run = [&](const Tensor<float>& in, const LinearWeight& w) { return lin ? lin(in, w) : linear(in, w); };
  const Tensor<float> g = run(x, w1);  // [T, inter] bf16
  const Tensor<float> u = run(x, w3);  // [T, inter] bf16
  return run(swiglu(g, u, routing_weight, swiglu_limit), w2);
}

Tensor<float> swiglu(const Tensor<float>& g, const Tensor<float>& u, const float* routing_weight, double swiglu_limit) {
  const int64_t T = g.dim(0), inter = g.dim(1);
  DSV41_CHECK(u.shape() == g.shape(), "swiglu: w1 output ", shape_string(g.shape()), " vs w3 output ",
              shape_string(u.shape()));
  const float limit = static_cast<float>(swiglu_limit);
  Tensor<float> h({T, inter}, "expert.h");  // bf16 after the cast
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      float gv = g.at(t, i), uv = u.at(t, i);
      if (limit > 0.0f) {
        uv = std::min(std::max(uv, -limit), limit);
        gv = std::min(gv, limit);
      }
      float hv = silu(gv) * uv;
      if (routing_weight != nullptr) hv = routing_weight[t] * hv;
      h.at(t, i) = round_to_bf16(hv);
    }
  }
  return h;
}

ExpertBatch expert_batch(const Tensor<float>& x, const MoeRouting& routing, int e) {
  const int64_t T = x.dim(0), dim = x.dim(1);
  const int k = static_cast<int>(routing.experts.dim(1));
  ExpertBatch b;
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      if (routing.experts.at(t, j) == e) {
        b.tokens.push_back(t);
        b.weights.push_back(routing.weights.at(t, j));
      }
    }
  }
  b.rows = Tensor<float>({static_cast<int64_t>(b.tokens.size()), dim}, "moe.x_e");
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    std::copy(x.row(b.tokens[i]), x.row(b.tokens[i]) + dim, b.rows.row(static_cast<int64_t>(i)));
  }
  return b;
}

Tensor<float> moe_experts(const Tensor<float>& x, const MoeWeights& w, const MoeRouting& routing,
                          const ModelConfig& c, const ExpertLinear& lin) {
  const int64_t T = x.dim(0), dim = x.dim(1);
  DSV41_CHECK(routing.experts.rank() == 2 && routing.experts.dim(0) == T &&
                  routing.weights.shape() == routing.experts.shape(),
              "moe_experts: routing ", shape_string(routing.experts.shape()), " / ",
              shape_string(routing.weights.shape()), " for ", T, " tokens");
  Tensor<float> acc({T, dim}, "moe.acc");  // fp32
  for (int e = 0; e < static_cast<int>(w.w1.size()); ++e) {
    const ExpertBatch b = expert_batch(x, routing, e);
    if (b.tokens.empty()) continue;
    const Tensor<float> ye = expert_forward(b.rows, w.w1[e], w.w2[e], w.w3[e], b.weights.data(), c.swiglu_limit, lin);
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      for (int64_t d = 0; d < dim; ++d) acc.at(b.tokens[i], d) += ye.at(static_cast<int64_t>(i), d);
    }
  }
  const Tensor<float> shared = expert_forward(x, w.s_w1, w.s_w2, w.s_w3, nullptr, c.swiglu_limit, lin);
  Tensor<float> y({T, dim}, "moe.y");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < dim; ++d) y.at(t, d) = round_to_bf16(acc.at(t, d) + shared.at(t, d));
  }
  return y;
}

}  // namespace dsv41::reference
