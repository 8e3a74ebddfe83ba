// scenarios/defects/reordered_ops.cc: the order-variant calibration ops (reordered_ops.h).
#include "scenarios/defects/reordered_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/linear.h"
#include "reference/ops/moe.h"
#include "reference/ops/numerics.h"
#include "reference/seam/forwarding_ops.h"

namespace dsv41::scenarios::defects {
namespace {

using reference::LinearWeight;
using reference::Tensor;

constexpr int64_t kQuantBlock = 32;  // the K block of act_quant and of fp8/fp4 weight scales

float pairwise(const float* t, int64_t n) {
  if (n == 0) return 0.0f;
  if (n == 1) return t[0];
  const int64_t h = n / 2;
  return pairwise(t, h) + pairwise(t + h, n - h);
}

float sequential(const float* t, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += t[i];
  return acc;
}

// tiles: each tile of 16 terms summed in double (exact for up to 16 products of bf16 / E4M3
// operands: what a tensor core's wide internal adder does), rounded once to fp32, tiles added in fp32.
float tiled(const float* t, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n; b += 16) {
    double s = 0;
    for (int64_t i = b; i < std::min(n, b + 16); ++i) s += static_cast<double>(t[i]);
    acc += static_cast<float>(s);
  }
  return acc;
}

// The K order of one output: sum_i a[i] * b[i] (or the precomputed terms) in the variant's order.
float ordered_dot(const float* a, const float* b, int64_t n, SumOrder o, std::vector<float>& scratch) {
  if (o == SumOrder::kFma) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i], acc);
    return acc;
  }
  scratch.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scratch[static_cast<size_t>(i)] = a[i] * b[i];
  return ordered_sum(scratch.data(), n, o);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The dequantization-free values of the weight row o: code values (fp8/fp4) or the bf16/fp32 values.
void weight_row(const LinearWeight& w, int64_t o, std::vector<float>& out) {
  out.resize(static_cast<size_t>(w.in));
  if (w.is_packed()) {
    reference::unpack_f4_values(w.packed.data(), o * w.in, w.in, out.data());
  } else {
    std::copy(w.w.begin() + o * w.in, w.w.begin() + (o + 1) * w.in, out.begin());
  }
}

float weight_scale(const LinearWeight& w, int64_t o, int64_t kb) {
  if (w.dtype == reference::DType::kF8E4M3) {
    return w.scale[static_cast<size_t>((o / kQuantBlock) * ceil_div(w.in, kQuantBlock) + kb)];
  }
  return w.scale[static_cast<size_t>(o * (w.in / kQuantBlock) + kb)];
}

// y = x w^T with the variant's K order. bf16 / fp32 weights: fp32 products (exact for bf16 x bf16)
// summed in order, then bf16 (to_bf16) or kept fp32. fp8 / fp4 weights (to_bf16 always): act_quant
// of each row as the reference does it, the exact block partials, each scaled by the two E8M0
// scales, the scaled partials summed in order (kFma: fma(partial * xs, ws, acc)).
Tensor<float> reordered_linear(const Tensor<float>& x, const LinearWeight& w, bool to_bf16, SumOrder o) {
  DSV41_CHECK(x.rank() == 2 && x.dim(1) == w.in, "reordered linear '", w.name, "': input ",
              reference::shape_string(x.shape()), " for in = ", w.in);
  const int64_t T = x.dim(0), in = w.in, out = w.out;
  const bool block_scaled = w.dtype == reference::DType::kF8E4M3 || w.dtype == reference::DType::kF4;
  Tensor<float> y({T, out}, w.name + ".y");
  std::vector<float> wr, scratch, xq(static_cast<size_t>(in)), xs(static_cast<size_t>(std::max<int64_t>(1, in / kQuantBlock)));
  std::vector<float> terms;
  for (int64_t t = 0; t < T; ++t) {
    const float* a = x.row(t);
    if (block_scaled && to_bf16) reference::act_quant_row(a, in, xq.data(), xs.data());
    for (int64_t oo = 0; oo < out; ++oo) {
      weight_row(w, oo, wr);
      float v = 0;
      if (block_scaled && to_bf16) {
        const int64_t nkb = in / kQuantBlock;
        if (o == SumOrder::kFma) {
          for (int64_t kb = 0; kb < nkb; ++kb) {
            const float partial = reference::dot_exact_f32(xq.data() + kb * kQuantBlock, wr.data() + kb * kQuantBlock, kQuantBlock);
            v = std::fma(partial * xs[static_cast<size_t>(kb)], weight_scale(w, oo, kb), v);
          }
        } else {
          terms.resize(static_cast<size_t>(nkb));
          for (int64_t kb = 0; kb < nkb; ++kb) {
            const float partial = reference::dot_exact_f32(xq.data() + kb * kQuantBlock, wr.data() + kb * kQuantBlock, kQuantBlock);
            terms[static_cast<size_t>(kb)] = (partial * xs[static_cast<size_t>(kb)]) * weight_scale(w, oo, kb);
          }
          v = ordered_sum(terms.data(), nkb, o);
        }
      } else {
        if (block_scaled) {  // linear_fp32 of a quantized weight: the dequantized values
          for (int64_t i = 0; i < in; ++i) wr[static_cast<size_t>(i)] *= weight_scale(w, oo, i / kQuantBlock);
        }
        v = ordered_dot(a, wr.data(), in, o, scratch);
      }
      y.at(t, oo) = to_bf16 ? reference::round_to_bf16(v) : v;
    }
  }
  return y;
}

// Row i of sparse_attn's index list, permuted: the online softmax meets the same set in another order.
std::vector<int64_t> index_permutation(int64_t K, SumOrder o) {
  std::vector<int64_t> p(static_cast<size_t>(K));
  std::iota(p.begin(), p.end(), 0);
  switch (o) {
    case SumOrder::kReversed:
    case SumOrder::kFma: std::reverse(p.begin(), p.end()); break;
    case SumOrder::kPairwise:
    case SumOrder::kTiles: {
      std::vector<int64_t> q;
      for (int64_t i = 0; i < K; i += 2) q.push_back(i);
      for (int64_t i = 1; i < K; i += 2) q.push_back(i);
      p = q;
      break;
    }
    case SumOrder::kBlocked: std::rotate(p.begin(), p.begin() + K / 2, p.end()); break;
    case SumOrder::kSplitK: std::rotate(p.begin(), p.begin() + K / 4, p.end()); break;
    case SumOrder::kTrunc13: break;  // the reference's order (only its F8 linears differ)
  }
  return p;
}

class ReorderedOps : public reference::seam::ForwardingOps {
 public:
  explicit ReorderedOps(SumOrder o)
      : ForwardingOps(reference::seam::reference_ops(), std::string("reordered(") + defects::name(o) + ")"), order_(o) {}

  T32 linear(const T32& x, const LinearWeight& w) const override {
    if (w.dtype != reference::DType::kF32 && w.dtype != reference::DType::kBF16 &&
        w.dtype != reference::DType::kF8E4M3 && w.dtype != reference::DType::kF4) {
      return ForwardingOps::linear(x, w);
    }
    if (w.dtype == reference::DType::kF32) return reordered_linear(x, w, /*to_bf16=*/false, order_);
    return reordered_linear(x, w, /*to_bf16=*/true, order_);
  }
  T32 linear_fp32(const T32& x, const LinearWeight& w) const override {
    return reordered_linear(x, w, /*to_bf16=*/false, order_);
  }
  T32 grouped_linear(const T32& x, const LinearWeight& w, int groups) const override {
    DSV41_CHECK(groups > 0 && w.out % groups == 0 && x.rank() == 2 && x.dim(1) == groups * w.in,
                "reordered grouped_linear '", w.name, "': input ", reference::shape_string(x.shape()), " for ", groups,
                " groups of [", w.out, ", ", w.in, "]");
    const int64_t T = x.dim(0), width = w.in, r = w.out / groups;
    T32 y({T, w.out}, w.name + ".y");
    std::vector<float> scratch;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < r; ++j) {
          const float v = ordered_dot(x.row(t) + g * width, w.w.data() + (g * r + j) * width, width, order_, scratch);
          y.at(t, g * r + j) = reference::round_to_bf16(v);
        }
      }
    }
    return y;
  }
  T32 rms_norm(const T32& x, const T32& weight, double eps) const override {
    const int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
    T32 y(x.shape(), x.name() + ".rms_norm");
    std::vector<float> sq(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data().data() + r * n;
      for (int64_t i = 0; i < n; ++i) sq[static_cast<size_t>(i)] = xr[i] * xr[i];
      const float var = ordered_sum(sq.data(), n, order_ == SumOrder::kFma ? SumOrder::kReversed : order_) /
                        static_cast<float>(n);
      const float rs = 1.0f / std::sqrt(var + static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) {
        y.data()[static_cast<size_t>(r * n + i)] = reference::round_to_bf16(weight.data()[static_cast<size_t>(i)] * (xr[i] * rs));
      }
    }
    return y;
  }
  T32 moe_experts(const T32& x, const reference::MoeWeights& w, const reference::MoeRouting& routing,
                  const reference::ModelConfig& c) const override {
    const int64_t dim = x.dim(1);
    auto expert = [&](const T32& xe, const LinearWeight& w1, const LinearWeight& w2, const LinearWeight& w3,
                      const float* rw) {
      const T32 g = linear(xe, w1), u = linear(xe, w3);
      return linear(reference::swiglu(g, u, rw, c.swiglu_limit), w2);
    };
    T32 acc = expert(x, w.s_w1, w.s_w2, w.s_w3, nullptr);  // the shared expert first (fp32 accumulator)
    for (int e = static_cast<int>(w.w1.size()) - 1; e >= 0; --e) {  // routed experts in reverse order
      const reference::ExpertBatch b = reference::expert_batch(x, routing, e);
      if (b.tokens.empty()) continue;
      const T32 ye = expert(b.rows, w.w1[static_cast<size_t>(e)], w.w2[static_cast<size_t>(e)],
                            w.w3[static_cast<size_t>(e)], b.weights.data());
      for (size_t i = 0; i < b.tokens.size(); ++i) {
        for (int64_t d = 0; d < dim; ++d) acc.at(b.tokens[i], d) += ye.at(static_cast<int64_t>(i), d);
      }
    }
    for (float& v : acc.data()) v = reference::round_to_bf16(v);
    return acc;
  }
  T32 sparse_attn(const T32& q, const T32& window_kv, const reference::CacheRows& compressed, const T32& sink,
                  const TI32& idxs, float scale) const override {
    const int64_t T = idxs.dim(0), K = idxs.dim(1);
    const std::vector<int64_t> p = index_permutation(K, order_);
    TI32 permuted(idxs.shape(), idxs.name());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < K; ++j) permuted.at(t, j) = idxs.at(t, p[static_cast<size_t>(j)]);
    }
    return ForwardingOps::sparse_attn(q, window_kv, compressed, sink, permuted, scale);
  }

 private:
  SumOrder order_;
};

}  // namespace

const char* name(SumOrder o) {
  switch (o) {
    case SumOrder::kReversed: return "reversed";
    case SumOrder::kPairwise: return "pairwise";
    case SumOrder::kBlocked: return "blocked";
    case SumOrder::kFma: return "fma";
    case SumOrder::kSplitK: return "splitk";
    case SumOrder::kTiles: return "tiles";
    case SumOrder::kTrunc13: return "trunc13";
  }
  return "?";
}

const std::vector<SumOrder>& all_sum_orders() {
  static const std::vector<SumOrder> v = {SumOrder::kReversed, SumOrder::kPairwise, SumOrder::kBlocked,
                                          SumOrder::kFma,      SumOrder::kSplitK,   SumOrder::kTiles};
  return v;
}

SumOrder sum_order_from_name(const std::string& n) {
  std::string names;
  for (SumOrder o : all_sum_orders()) {
    if (n == name(o)) return o;
    names += (names.empty() ? "" : ", ") + std::string(name(o));
  }
  if (n == name(SumOrder::kTrunc13)) return SumOrder::kTrunc13;
  DSV41_FAIL("unknown order-variant '", n, "' (the variants: ", names, "; the emulation: trunc13)");
}

float ordered_sum(const float* t, int64_t n, SumOrder o) {
  switch (o) {
    case SumOrder::kReversed: {
      float acc = 0.0f;
      for (int64_t i = n - 1; i >= 0; --i) acc += t[i];
      return acc;
    }
    case SumOrder::kPairwise: return pairwise(t, n);
    case SumOrder::kBlocked: {
      float acc = 0.0f;
      for (int64_t b = 0; b < n; b += 64) acc += sequential(t + b, std::min<int64_t>(64, n - b));
      return acc;
    }
    case SumOrder::kFma: return sequential(t, n);
    case SumOrder::kSplitK: {
      const int64_t s = ceil_div(n, 4);
      float acc = 0.0f;
      for (int64_t b = 0; b < n; b += s) acc += sequential(t + b, std::min(s, n - b));
      return acc;
    }
    case SumOrder::kTiles: return tiled(t, n);
    case SumOrder::kTrunc13: return sequential(t, n);  // K order, as the production promotion
  }
  return 0.0f;
}

// The 32-block dot of e4m3 values as Hopper's fp8 wgmma computes it (kTrunc13, reordered_ops.h).
float tensor_core_block_dot(const float* a, const float* b, int64_t n) {
  double pmax = 0;
  for (int64_t i = 0; i < n; ++i) pmax = std::max(pmax, std::fabs(double(a[i]) * b[i]));
  if (pmax == 0) return 0.0f;
  const double q = std::ldexp(1.0, std::ilogb(pmax) - 14);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::trunc(double(a[i]) * b[i] / q) * q;  // exact: few bits
  if (s == 0) return 0.0f;
  const double qs = std::ldexp(1.0, std::ilogb(s) - 13);  // the sum kept to 14 significant bits
  return static_cast<float>(std::trunc(s / qs) * qs);
}

namespace {

class TruncatingFp8Ops : public reference::seam::ForwardingOps {
 public:
  TruncatingFp8Ops() : ForwardingOps(reference::seam::reference_ops(), "reordered(trunc13)") {}
  T32 linear(const T32& x, const LinearWeight& w) const override {
    if (w.dtype != reference::DType::kF8E4M3 || w.is_packed()) return ForwardingOps::linear(x, w);
    DSV41_CHECK(x.rank() == 2 && x.dim(1) == w.in && w.in % kQuantBlock == 0, "trunc13 linear '", w.name, "': input ",
                reference::shape_string(x.shape()), " for in = ", w.in);
    const int64_t T = x.dim(0), in = w.in, out = w.out, nkb = in / kQuantBlock;
    T32 y({T, out}, w.name + ".y");
    std::vector<float> wr, xq(static_cast<size_t>(in)), xs(static_cast<size_t>(nkb));
    for (int64_t t = 0; t < T; ++t) {
      reference::act_quant_row(x.row(t), in, xq.data(), xs.data());
      for (int64_t o = 0; o < out; ++o) {
        weight_row(w, o, wr);
        float v = 0;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          const float partial = tensor_core_block_dot(xq.data() + kb * kQuantBlock, wr.data() + kb * kQuantBlock, kQuantBlock);
          v += (partial * xs[static_cast<size_t>(kb)]) * weight_scale(w, o, kb);
        }
        y.at(t, o) = reference::round_to_bf16(v);
      }
    }
    return y;
  }
  // The experts' linears through the block dot above, as the production CUDA moe_experts runs
  // them (cuda/cuda_ops_moe.cc calls the ops' linear): the shared expert's F8 projections differ.
  T32 moe_experts(const T32& x, const reference::MoeWeights& w, const reference::MoeRouting& routing,
                  const reference::ModelConfig& c) const override {
    return reference::moe_experts(x, w, routing, c,
                                  [this](const T32& in, const LinearWeight& lw) { return linear(in, lw); });
  }
};

}  // namespace

std::unique_ptr<reference::seam::Ops> make_reordered_ops(SumOrder o) {
  if (o == SumOrder::kTrunc13) return std::make_unique<TruncatingFp8Ops>();
  return std::make_unique<ReorderedOps>(o);
}

}  // namespace dsv41::scenarios::defects
