// cuda/cuda_ops_moe.cc
//
// CudaOps::moe_gate and CudaOps::moe_experts: BIT-EXACT.
//   moe_gate     device: logits = linear_fp32(x, gate) [T, E]; host: reference::moe_route
//                (sqrt(softplus(logit / temp)) with glibc's exp/log1p, the biased stable sort,
//                moe_routing_weights) on the downloaded logits: log1p has no proven device twin.
//   moe_experts  per expert in index order: device gather of its tokens' rows, w1 and w3 linears,
//                the SwiGLU (cuda/moe.cu swiglu: clamp, silu(g) * u with libm_expf = glibc's expf
//                bit for bit, * routing weight, bf16), w2 linear, acc[token] += y in list order;
//                then the shared expert the same way and bf16(acc + shared). When this process's
//                std::exp is not the libm libm_expf reproduces (libm_expf_matches_host), the
//                SwiGLU runs on the host in the reference's own reference::swiglu.
// moe_routing_weights stays a host fallback (a few scalars per token).
// Inputs the reference rejects run the reference on host copies, which raises its own error.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
#include "reference/ops/moe.h"
#include "reference/ops/numerics.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {

const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }

// reference expert_forward with the three linears on the device. x: [n, dim] (device or host).
Tensor<float> expert_forward(const CudaOps& ops, const Tensor<float>& x, const reference::LinearWeight& w1,
                             const reference::LinearWeight& w2, const reference::LinearWeight& w3,
                             const float* routing_weight, double swiglu_limit) {
  if (libm_expf_matches_host()) {  // the SwiGLU on the device (cuda/moe.cu swiglu)
    const Tensor<float> g = ops.linear(x, w1), u = ops.linear(x, w3);
    if (!(g.rank() == 2 && u.shape() == g.shape())) {  // the reference raises its error
      return ops.linear(reference::swiglu(ops.download(g), ops.download(u), routing_weight, swiglu_limit), w2);
    }
    const int64_t n = g.dim(0), inter = g.dim(1);
    DevIn<float> dg(g), du(u);
    const auto rw = routing_weight != nullptr ? to_device(std::vector<float>(routing_weight, routing_weight + n))
                                              : nullptr;
    Tensor<float> h = device_tensor<float>({n, inter}, "expert.h");
    gpu::swiglu(dg.get(), du.get(), rw ? rw->get() : nullptr, n, inter, swiglu_limit, n * inter > 0 ? dev(h) : nullptr);
    return ops.linear(h, w2);
  }
  const Tensor<float> g = ops.download(ops.linear(x, w1));
  const Tensor<float> u = ops.download(ops.linear(x, w3));
  return ops.linear(reference::swiglu(g, u, routing_weight, swiglu_limit), w2);  // the host step
}

const uint8_t* bytes_of(const float* p) { return reinterpret_cast<const uint8_t*>(p); }

}  // namespace

reference::MoeRouting CudaOps::moe_gate(const Tensor<float>& x, const reference::MoeWeights& w,
                                        const reference::ModelConfig& c, int layer) const {
  const int64_t E = w.gate.out;
  const int k = reference::moe_activated_experts(c, layer);
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
  reference::MoeRouting r = reference::moe_route(logits, w, c, layer);  // the host step
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
  if (T * dim > 0) fill_device_async(dev(acc), 0, static_cast<size_t>(T * dim) * sizeof(float));
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
