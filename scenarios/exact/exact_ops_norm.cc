// rms_norm and RoPE of the exact evaluation (scenarios/exact/exact_eval.h); bounds docs/cuda.md
// "Tolerances with their origin" (rms_norm's derivation: docs/numerics.md 1.4(c)).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/rope.h"
#include "scenarios/exact/exact_internal.h"

namespace dsv41::scenarios::exact {
namespace {

using reference::Tensor;

// y = w x / sqrt(sum x^2 / n + eps32), exact. Computed: x^2 exact (bf16 x), an fp32 sum of n
// non-negative terms in any order, / n, + eps: v = V (1 + t), |t| <= gamma_{n+1}(u32); sqrt and
// 1/ one rounding each: |r/R - 1| <= b_r = (1 + u) / ((1 - u) sqrt(1 - gamma)) - 1; two fp32
// products: |z - w x R| <= ((1 + b_r)(1 + u)^2 - 1) |w x R|; then bf16.
OpCase rms_case(const std::string& inputs, const Tensor<float>& x, const Tensor<float>& weight, double eps) {
  const int64_t T = x.dim(0), n = x.dim(1);
  const double u = kU32, g = gamma(n + 1, kU32);
  const double b_r = (1.0 + u) / ((1.0 - u) * std::sqrt(1.0 - g)) - 1.0;
  const double b_z = (1.0 + b_r) * (1.0 + u) * (1.0 + u) - 1.0;
  OpCase c;
  c.op = "rms_norm";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = n;
  c.row = n;
  c.out = kBf16;
  c.precisions = "x bf16, w bf16; fp32 sum of squares (torch order), fp32 sqrt, 1/, 2 products";
  c.formula = "((1+b_r)(1+u32)^2-1)|w x R| + ulp_bf16/2, b_r = (1+u32)/((1-u32)sqrt(1-gamma_{n+1}(u32)))-1";
  const Exact eps32 = exact_of(static_cast<float>(eps));
  for (int64_t t = 0; t < T; ++t) {
    Exact ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += exact_of(x.at(t, i)) * exact_of(x.at(t, i));
    const Exact r = 1 / mp::sqrt(ss / n + eps32);
    for (int64_t i = 0; i < n; ++i) {
      const Exact y = exact_of(weight.data()[static_cast<size_t>(i)]) * exact_of(x.at(t, i)) * r;
      c.exact.push_back(y);
      c.bound.push_back(finish_bound(y, b_z * to_double(mp::abs(y)), kBf16));
    }
  }
  c.run = [x, weight, eps](const reference::seam::Ops& ops) {
    return ops.download(ops.rms_norm(ops.upload(x), ops.upload(weight), eps)).data();
  };
  return c;
}

// The rd-wide tail of each head, pairs (a, b) rotated by the table's (c, s) (the table's values
// are inputs: its cosf/sinf are the table's semantics): y0 = a c - b s, y1 = a s + b c exact.
// Computed: two rounded products, one rounded sum: |err| <= u (1 + u)(|a c| + |b s|) + u |y|;
// then bf16. Channels before the tail are copied: bound 0.
OpCase rope_case(const std::string& inputs, const Tensor<float>& x, int64_t heads,
                 const std::shared_ptr<const reference::RopeTable>& table, int64_t first_pos, int64_t stride, bool inverse) {
  const reference::RopeTable& rope = *table;
  const int64_t T = x.dim(0), width = x.dim(1) / heads, rd = rope.rope_dim();
  OpCase c;
  c.op = inverse ? "rope_rows (inverse)" : "rope_rows";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = 2;
  c.row = x.dim(1);
  c.out = kBf16;
  c.precisions = "x bf16, cos/sin fp32 (the table); 2 fp32 products, 1 fp32 sum";
  c.formula = "u32(1+u32)(|a c|+|b s|) + u32|y| + ulp_bf16/2; untouched channels 0";
  c.exact.resize(static_cast<size_t>(x.numel()));
  c.bound.assign(c.exact.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = first_pos + t * stride;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = t * x.dim(1) + h * width;
      for (int64_t i = 0; i < width; ++i) c.exact[static_cast<size_t>(base + i)] = exact_of(x.data()[static_cast<size_t>(base + i)]);
      for (int64_t i = 0; i < rd / 2; ++i) {
        const size_t k0 = static_cast<size_t>(base + width - rd + 2 * i);
        const Exact a = exact_of(x.data()[k0]), b = exact_of(x.data()[k0 + 1]);
        const Exact cs = exact_of(rope.cos(pos)[i]);
        const Exact sn = inverse ? Exact(-exact_of(rope.sin(pos)[i])) : exact_of(rope.sin(pos)[i]);
        const Exact y0 = a * cs - b * sn, y1 = a * sn + b * cs;
        const double m0 = to_double(mp::abs(a * cs) + mp::abs(b * sn)), m1 = to_double(mp::abs(a * sn) + mp::abs(b * cs));
        c.exact[k0] = y0;
        c.exact[k0 + 1] = y1;
        c.bound[k0] = finish_bound(y0, kU32 * (1 + kU32) * m0 + kU32 * std::fabs(to_double(y0)), kBf16);
        c.bound[k0 + 1] = finish_bound(y1, kU32 * (1 + kU32) * m1 + kU32 * std::fabs(to_double(y1)), kBf16);
      }
    }
  }
  c.run = [x, heads, table, first_pos, stride, inverse](const reference::seam::Ops& ops) {
    Tensor<float> y = ops.upload(x);
    ops.rope_rows(y, heads, *table, first_pos, stride, inverse);
    return ops.download(std::move(y)).data();
  };
  return c;
}

}  // namespace

void add_norm_rope_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out) {
  const bool small = sizes == Sizes::kSmall;
  const reference::ModelConfig cfg = reference::load_config("tiny");
  {
    Draws d(seed, "rms_norm");
    const int64_t n = small ? 4096 : 256;
    out.push_back(rms_case("random", bf16_tensor(d, {4, n}, 1.0, "x"), bf16_tensor(d, {n}, 1.0, "w"), cfg.norm_eps));
    out.push_back(rms_case("long", bf16_tensor(d, {2, small ? 16384 : 7168}, 1.0, "x"),
                           bf16_tensor(d, {small ? 16384 : 7168}, 1.0, "w"), cfg.norm_eps));
    // A wide dynamic range: each value scaled by 2^[-30, 30] (the sum is dominated by a few).
    Tensor<float> xr = bf16_tensor(d, {4, n}, 1.0, "x");
    for (float& v : xr.data()) v = std::ldexp(v, static_cast<int>(d.bits() % 61) - 30);
    out.push_back(rms_case("range", xr, bf16_tensor(d, {n}, 1.0, "w"), cfg.norm_eps));
  }
  {
    auto rope = std::make_shared<const reference::RopeTable>(
        reference::RopeTable::make(cfg, reference::RopeKind::kCompressed));
    Draws d(seed, "rope_rows");
    const int64_t heads = cfg.n_heads, width = cfg.head_dim;
    const int64_t T = small ? 16 : 4;
    const int64_t first = static_cast<int64_t>(d.bits() % static_cast<uint64_t>(rope->max_seq_len() - 2 * T));
    out.push_back(rope_case("random", bf16_tensor(d, {T, heads * width}, 1.0, "x"), heads, rope, first, 1, false));
    out.push_back(rope_case("random", bf16_tensor(d, {T, heads * width}, 1.0, "x"), heads, rope, first, 2, true));
  }
}

}  // namespace dsv41::scenarios::exact
