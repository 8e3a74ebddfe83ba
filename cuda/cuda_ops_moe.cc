// cuda/cuda_ops_moe.cc
//
// CudaOps::moe_gate and CudaOps::moe_experts: the linears run as kernels (cuda/linear.cu,
// bit-exact), the scalar transcendental steps run on the host in the reference's own statements,
// for the reason of docs/cuda.md (the reference takes glibc's std::exp / std::log1p; the device's
// differ): BIT-EXACT by construction.
//   moe_gate     device: logits = linear_fp32(x, gate) [T, E]; host: sqrt(softplus(logit / temp)),
//                the biased stable sort (lower expert index wins ties), moe_routing_weights.
//   moe_experts  per expert in index order: device gather of its tokens' rows, w1 and w3 linears;
//                host: clamp, silu(g) * u, * routing weight, bf16 (reference expert_forward's
//                loop); device: w2 linear, acc[token] += y in list order (cuda/moe.cu); then the
//                shared expert the same way and bf16(acc + shared) on the device.
// moe_routing_weights stays a host fallback (a few scalars per token).
// Inputs the reference rejects run the reference on host copies, which raises its own error.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "reference/moe.h"
#include "reference/numerics.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {

const reference::Ops& ref() { return reference::reference_ops(); }

// reference/moe.cc softplus, silu and activated(): the same statements.
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }
float silu(float v) { return v / (1.0f + std::exp(-v)); }
int activated(const reference::ModelConfig& c, int layer) {
  return layer < c.n_layers || c.dspark_n_activated_experts == 0 ? c.n_activated_experts
                                                                 : c.dspark_n_activated_experts;
}

// The middle of reference expert_forward on host copies of g = w1(x) and u = w3(x) (bf16):
// h = bf16(rw[t] * (silu(min(g, limit)) * clamp(u, -limit, limit))).
Tensor<float> swiglu_host(const Tensor<float>& g, const Tensor<float>& u, const float* routing_weight,
                          double swiglu_limit) {
  const int64_t T = g.dim(0), inter = g.dim(1);
  const float limit = static_cast<float>(swiglu_limit);
  Tensor<float> h({T, inter}, "expert.h");
  reference::parallel_for(T, [&](int64_t t) {
    for (int64_t i = 0; i < inter; ++i) {
      float gv = g.at(t, i), uv = u.at(t, i);
      if (limit > 0.0f) {
        uv = std::min(std::max(uv, -limit), limit);
        gv = std::min(gv, limit);
      }
      float hv = silu(gv) * uv;
      if (routing_weight != nullptr) hv = routing_weight[t] * hv;
      h.at(t, i) = formats::round_to_bf16(hv);
    }
  });
  return h;
}

// reference expert_forward with the three linears on the device. x: [n, dim] (device or host).
Tensor<float> expert_forward(const CudaOps& ops, const Tensor<float>& x, const reference::LinearWeight& w1,
                             const reference::LinearWeight& w2, const reference::LinearWeight& w3,
                             const float* routing_weight, double swiglu_limit) {
  const Tensor<float> g = ops.download(ops.linear(x, w1));
  const Tensor<float> u = ops.download(ops.linear(x, w3));
  return ops.linear(swiglu_host(g, u, routing_weight, swiglu_limit), w2);
}

const uint8_t* bytes_of(const float* p) { return reinterpret_cast<const uint8_t*>(p); }

}  // namespace

reference::MoeRouting CudaOps::moe_gate(const Tensor<float>& x, const reference::MoeWeights& w,
                                        const reference::ModelConfig& c, int layer) const {
  const int64_t E = w.gate.out;
  const int k = activated(c, layer);
  const bool ok = c.score_func == reference::ScoreFunc::kSqrtSoftplus && x.rank() == 2 && E > 0 && k >= 0 &&
                  k <= E && w.gate_bias.numel() == E;
  if (!ok) {  // the reference raises its error
    count("moe_gate", false);
    reference::MoeRouting r = ref().moe_gate(host_copy(x), w, c, layer);
    r.experts = upload(std::move(r.experts));
    r.weights = upload(std::move(r.weights));
    r.scores = upload(std::move(r.scores));
    return r;
  }
  const Tensor<float> logits = host_copy(linear_fp32(x, w.gate));  // [T, E] fp32, the device GEMM
  count("moe_gate", true);
  const int64_t T = x.dim(0);
  reference::MoeRouting r{Tensor<int32_t>({T, k}, "moe.experts"), Tensor<float>({T, k}, "moe.weights"),
                          Tensor<float>({T, E}, "moe.scores")};
  const float temp = static_cast<float>(c.gate_temp);
  const std::vector<float>& bias = w.gate_bias.data();
  for (int64_t t = 0; t < T; ++t) {  // reference moe_gate's loop
    std::vector<float> biased(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      r.scores.at(t, e) = std::sqrt(softplus(logits.at(t, e) / temp));
      biased[static_cast<size_t>(e)] = r.scores.at(t, e) + bias[static_cast<size_t>(e)];
    }
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return biased[static_cast<size_t>(a)] > biased[static_cast<size_t>(b)];
    });
    for (int j = 0; j < k; ++j) r.experts.at(t, j) = order[static_cast<size_t>(j)];
  }
  reference::moe_routing_weights(r, c);
  r.experts = upload(std::move(r.experts));
  r.weights = upload(std::move(r.weights));
  r.scores = upload(std::move(r.scores));
  return r;
}

Tensor<float> CudaOps::moe_experts(const Tensor<float>& x, const reference::MoeWeights& w,
                                   const reference::MoeRouting& routing, const reference::ModelConfig& c) const {
  const auto host = [&] {  // the reference raises its error
    count("moe_experts", false);
    const reference::MoeRouting h{host_copy(routing.experts), host_copy(routing.weights), host_copy(routing.scores)};
    return upload(ref().moe_experts(host_copy(x), w, h, c));
  };
  const bool ok = x.rank() == 2 && routing.experts.rank() == 2 && routing.experts.dim(0) == x.dim(0) &&
                  routing.weights.shape() == routing.experts.shape() && w.w2.size() == w.w1.size() &&
                  w.w3.size() == w.w1.size();
  if (!ok) return host();
  const int64_t T = x.dim(0), dim = x.dim(1);
  const Tensor<int32_t> experts = host_copy(routing.experts);
  const Tensor<float> weights_all = host_copy(routing.weights);
  const int64_t k = experts.dim(1);
  DevIn<float> dx(x);
  Tensor<float> acc = device_tensor<float>({T, dim}, "moe.acc");  // fp32, +0
  if (T * dim > 0) fill_device(dev(acc), 0, static_cast<size_t>(T * dim) * sizeof(float));
  for (int e = 0; e < static_cast<int>(w.w1.size()); ++e) {
    std::vector<int64_t> tokens;
    std::vector<float> weights;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (experts.at(t, j) == e) {
          tokens.push_back(t);
          weights.push_back(weights_all.at(t, j));
        }
      }
    }
    if (tokens.empty()) continue;
    const int64_t n = static_cast<int64_t>(tokens.size());
    const auto rows = to_device(tokens);
    Tensor<float> xe = device_tensor<float>({n, dim}, "moe.x_e");
    if (dim > 0) {
      copy_rows(bytes_of(dx.get()), rows->get(), reinterpret_cast<uint8_t*>(dev(xe)), nullptr, n,
                dim * static_cast<int64_t>(sizeof(float)));
    }
    const Tensor<float> ye = expert_forward(*this, xe, w.w1[e], w.w2[e], w.w3[e], weights.data(), c.swiglu_limit);
    if (!(ye.rank() == 2 && ye.dim(0) == n && ye.dim(1) == dim)) return host();
    DevIn<float> dye(ye);
    moe_scatter_add(dev(acc), dye.get(), rows->get(), n, dim);
  }
  const Tensor<float> shared = expert_forward(*this, x, w.s_w1, w.s_w2, w.s_w3, nullptr, c.swiglu_limit);
  if (!(shared.rank() == 2 && shared.dim(0) == T && shared.dim(1) == dim)) return host();
  count("moe_experts", true);
  DevIn<float> ds(shared);
  Tensor<float> y = device_tensor<float>({T, dim}, "moe.y");
  moe_finish(dev(acc), ds.get(), T * dim, dev(y));
  return y;
}

}  // namespace dsv41::gpu
