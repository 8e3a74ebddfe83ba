// moe_experts of the exact evaluation (scenarios/exact/exact_eval.h): routed SwiGLU experts (F4) and
// the shared expert (F8), summed (reference/ops/moe.h), evaluated exactly.
//
// Semantics per token and expert (the spec's roundings applied exactly): g = bf16(w1(x)),
// u = bf16(w3(x)) (exact F4/F8 linears after act_quant), h = bf16(silu(min(g, L)) clamp(u, -L, L) rw),
// o = bf16(w2(act_quant(h))); y = sum over the token's routed experts of o, plus the shared
// expert's o (rw = 1); final bf16 excluded.
//
// Bound: each linear's output lies within acc = gamma_{in/32}(u32) sum_b |s_b p_b| of its exact
// value before its bf16 rounding, so g and u lie in intervals through that rounding; h's exact
// function over the box (silu's minimum at -1.27846 included) widened by 6.01 u32 |h| (expf within
// 1 ulp, 1 +, /, two products), through bf16: dev_h. A 32-block of h with every dev_h = 0 is
// quantized identically; in another, when the block scale (E8M0 ceil of amax / 448) is the same
// at both ends of the amax range, each code is the E4M3 rounding of h / s at the interval's ends;
// else each dequantized value may move by dev_h + 2^-4 (2 |h| + dev_h) + 3 * 2^-10 a_s (E4M3's
// relative step, its subnormal step, the scale at most doubling). w2's output then lies within its acc plus sum_k |w2 s| dev_k, through
// bf16: dev_o; y = fp32 sum of the k + 1 expert outputs:
// |err| <= sum_e dev_o + gamma_k(u32) sum_e max|o| + ulp_bf16/2.
// The tensor-core bound (OpCase::tensor_core_bound: the production backend runs the F8 shared
// expert's linears on the fp8 tensor cores) widens each F8 linear's radius to
// tc + gamma_{in/32}(u32) (sum_b |s_b p_b| + tc), tc = sum_b s_b delta_b (scenarios/judge/fp8_mma_bound.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "formats/qdq.h"
#include "reference/ops/config.h"
#include "reference/ops/linear.h"
#include "reference/ops/moe.h"
#include "scenarios/exact/exact_internal.h"

namespace dsv41::scenarios::exact {
namespace {

using reference::LinearWeight;
using reference::Tensor;

Exact silu(const Exact& g) { return g / (1 + mp::exp(-g)); }

struct Interval {
  Exact lo, hi;
};

// One expert on one token: the exact semantic output o [dim] (bf16 values), its deviation bound
// dev [dim] and magnitude bound mx [dim].
// tensor_cores: the F8 linears' block dots on the fp8 tensor cores (their delta terms added).
void expert_exact(const float* x, const LinearWeight& w1, const LinearWeight& w2, const LinearWeight& w3, float rw,
                  double limit, bool tensor_cores, std::vector<Exact>& o, std::vector<double>& dev,
                  std::vector<double>& mx) {
  const double u = kU32;
  std::vector<Exact> y1, m1, y3, m3;
  std::vector<double> tc1, tc3, tc2;
  exact_quantized_row(x, w1, y1, m1, &tc1);
  exact_quantized_row(x, w3, y3, m3, &tc3);
  if (!tensor_cores) {
    tc1.assign(tc1.size(), 0.0);
    tc3.assign(tc3.size(), 0.0);
  }
  const int64_t inter = w1.out;
  const double g1 = gamma(w1.in / 32, u), g3 = gamma(w3.in / 32, u);
  const Exact L = Exact(static_cast<double>(static_cast<float>(limit)));
  const Exact g0("-1.2784645427610737951");  // argmin of silu
  std::vector<float> h(static_cast<size_t>(inter));
  std::vector<double> hdev(static_cast<size_t>(inter)), habs(static_cast<size_t>(inter));
  std::vector<float> h_lo(static_cast<size_t>(inter)), h_hi(static_cast<size_t>(inter));  // the computed h's range
  auto h_of = [&](const Exact& g, const Exact& uu) {
    const Exact gc = std::min<Exact>(g, L), uc = std::max<Exact>(std::min<Exact>(uu, L), Exact(-L));
    return silu(gc) * uc * exact_of(rw);
  };
  for (int64_t i = 0; i < inter; ++i) {
    const size_t k = static_cast<size_t>(i);
    const Exact ge = round_to(y1[k], kBf16), ue = round_to(y3[k], kBf16);
    const Exact a1 = Exact(g1) * (m1[k] + Exact(tc1[k])) + Exact(tc1[k]);
    const Exact a3 = Exact(g3) * (m3[k] + Exact(tc3[k])) + Exact(tc3[k]);
    const Interval gi{round_to(y1[k] - a1, kBf16), round_to(y1[k] + a1, kBf16)};
    const Interval ui{round_to(y3[k] - a3, kBf16), round_to(y3[k] + a3, kBf16)};
    const Exact he = round_to(h_of(ge, ue), kBf16);
    Exact lo = he, hi = he;
    std::vector<Exact> gs{gi.lo, gi.hi};
    if (gi.lo < g0 && g0 < gi.hi) gs.push_back(g0);
    for (const Exact& gg : gs) {
      for (const Exact& uu : {ui.lo, ui.hi}) {
        const Exact v = h_of(gg, uu);
        lo = std::min<Exact>(lo, v);
        hi = std::max<Exact>(hi, v);
      }
    }
    const Exact widen = Exact(6.01 * u) * std::max<Exact>(mp::abs(lo), mp::abs(hi));
    const Exact hlo = round_to(lo - widen, kBf16), hhi = round_to(hi + widen, kBf16);
    h[k] = static_cast<float>(to_double(he));
    h_lo[k] = static_cast<float>(to_double(hlo));
    h_hi[k] = static_cast<float>(to_double(hhi));
    hdev[k] = to_double(std::max<Exact>(mp::abs(hlo - he), mp::abs(hhi - he)));
    habs[k] = std::fabs(to_double(he));
  }
  // The dequantized h of the computed side may differ only in blocks holding an uncertain h.
  std::vector<float> codes(static_cast<size_t>(inter)), ascale(static_cast<size_t>(inter / 32));
  reference::act_quant_row(h.data(), inter, codes.data(), ascale.data());
  std::vector<double> xdev(static_cast<size_t>(inter), 0.0);
  for (int64_t b = 0; b < inter / 32; ++b) {
    bool uncertain = false;
    float amax_small = 0.0f, amax_large = 0.0f;
    for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
      const size_t i = static_cast<size_t>(k);
      uncertain = uncertain || hdev[i] > 0;
      const float small = h_lo[i] <= 0.0f && h_hi[i] >= 0.0f ? 0.0f : std::min(std::fabs(h_lo[i]), std::fabs(h_hi[i]));
      amax_small = std::max(amax_small, small);
      amax_large = std::max(amax_large, std::max(std::fabs(h_lo[i]), std::fabs(h_hi[i])));
    }
    if (!uncertain) continue;
    const uint8_t s_small = formats::fp8_scale(amax_small), s_large = formats::fp8_scale(amax_large);
    for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
      const size_t i = static_cast<size_t>(k);
      if (s_small == s_large) {
        // The block scale is the same for every computed h: each element's code is a monotone
        // rounding of h / s, so its range is that of the interval's ends.
        const float sc = formats::e8m0_decode(s_small);
        auto q = [sc](float v) {
          return formats::e4m3_decode(formats::e4m3_encode_satfinite(std::clamp(v / sc, -448.0f, 448.0f))) * sc;
        };
        const double xe = static_cast<double>(codes[i]) * ascale[static_cast<size_t>(b)];
        xdev[i] = std::max(std::fabs(q(h_lo[i]) - xe), std::fabs(q(h_hi[i]) - xe));
      } else {
        xdev[i] = hdev[i] + 0x1p-4 * (2 * habs[i] + hdev[i]) + 3 * 0x1p-10 * ascale[static_cast<size_t>(b)];
      }
    }
  }
  std::vector<Exact> y2, m2;
  exact_quantized_row(h.data(), w2, y2, m2, &tc2);
  if (!tensor_cores) tc2.assign(tc2.size(), 0.0);
  const double g2 = gamma(w2.in / 32, u);
  o.assign(static_cast<size_t>(w2.out), Exact(0));
  dev.assign(o.size(), 0.0);
  mx.assign(o.size(), 0.0);
  for (int64_t d = 0; d < w2.out; ++d) {
    const size_t k = static_cast<size_t>(d);
    double extra = 0.0;
    for (int64_t i = 0; i < inter; ++i) {
      if (xdev[static_cast<size_t>(i)] == 0.0) continue;
      const float ws = w2.dtype == reference::DType::kF8E4M3
                           ? w2.scale[static_cast<size_t>((d / 32) * ((w2.in + 31) / 32) + i / 32)]
                           : w2.scale[static_cast<size_t>(d * (w2.in / 32) + i / 32)];
      extra += std::fabs(static_cast<double>(w2.w[static_cast<size_t>(d * w2.in + i)]) * ws) * xdev[static_cast<size_t>(i)];
    }
    const Exact r = Exact(g2 * (to_double(m2[k]) + tc2[k]) + tc2[k] + extra);
    o[k] = round_to(y2[k], kBf16);
    const Exact olo = round_to(y2[k] - r, kBf16), ohi = round_to(y2[k] + r, kBf16);
    dev[k] = to_double(std::max<Exact>(mp::abs(olo - o[k]), mp::abs(ohi - o[k])));
    mx[k] = to_double(std::max<Exact>(mp::abs(olo), mp::abs(ohi)));
  }
}

OpCase experts_case(const std::string& inputs, const Tensor<float>& x, const std::shared_ptr<const reference::MoeWeights>& wp,
                    const reference::MoeRouting& routing, const reference::ModelConfig& cfg) {
  const reference::MoeWeights& w = *wp;
  const int64_t T = x.dim(0), dim = x.dim(1), k = routing.experts.dim(1);
  OpCase c;
  c.op = "moe_experts";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = std::max(dim, w.w2[0].in);
  c.row = dim;
  c.out = kBf16;
  c.precisions = "x bf16; F4 routed / F8 shared SwiGLU linears (act_quant), fp32 silu (expf), bf16 h; fp32 sum of k+1 experts";
  c.formula = "sum_e dev_o + gamma_k(u32) sum_e max|o| + ulp_bf16/2 (intervals through g, u, h, act_quant, o: docs/cuda.md)";
  for (int64_t t = 0; t < T; ++t) {
    for (const bool tensor_cores : {false, true}) {
      std::vector<Exact> y(static_cast<size_t>(dim), Exact(0));
      std::vector<double> dev(static_cast<size_t>(dim), 0.0), mag(static_cast<size_t>(dim), 0.0);
      std::vector<Exact> o;
      std::vector<double> od, om;
      auto add = [&] {
        for (size_t d = 0; d < o.size(); ++d) {
          y[d] += o[d];
          dev[d] += od[d];
          mag[d] += om[d];
        }
      };
      for (int64_t j = 0; j < k; ++j) {
        const int e = routing.experts.at(t, j);
        expert_exact(x.row(t), w.w1[static_cast<size_t>(e)], w.w2[static_cast<size_t>(e)], w.w3[static_cast<size_t>(e)],
                     routing.weights.at(t, j), cfg.swiglu_limit, tensor_cores, o, od, om);
        add();
      }
      expert_exact(x.row(t), w.s_w1, w.s_w2, w.s_w3, 1.0f, cfg.swiglu_limit, tensor_cores, o, od, om);
      add();
      for (int64_t d = 0; d < dim; ++d) {
        const size_t i = static_cast<size_t>(d);
        const double b = finish_bound(y[i], dev[i] + gamma(k, kU32) * mag[i], kBf16);
        if (tensor_cores) {
          c.tensor_core_bound.push_back(b);
        } else {
          c.exact.push_back(y[i]);
          c.bound.push_back(b);
        }
      }
    }
  }
  c.run = [x, wp, routing, cfg](const reference::seam::Ops& ops) {
    return ops.download(ops.moe_experts(ops.upload(x), *wp, routing, cfg)).data();
  };
  return c;
}

}  // namespace

void add_moe_experts_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out) {
  const reference::ModelConfig cfg = reference::load_config("tiny");
  Draws d(seed, "moe_experts");
  const int64_t E = cfg.n_routed_experts, dim = cfg.dim, inter = cfg.moe_inter_dim, T = sizes == Sizes::kSmall ? 16 : 4;
  const int k = reference::moe_activated_experts(cfg, 2);
  auto w = std::make_shared<reference::MoeWeights>();
  for (int64_t e = 0; e < E; ++e) {
    w->w1.push_back(random_weight(d, reference::DType::kF4, inter, dim, "w1"));
    w->w2.push_back(random_weight(d, reference::DType::kF4, dim, inter, "w2"));
    w->w3.push_back(random_weight(d, reference::DType::kF4, inter, dim, "w3"));
  }
  w->s_w1 = random_weight(d, reference::DType::kF8E4M3, inter, dim, "s_w1");
  w->s_w2 = random_weight(d, reference::DType::kF8E4M3, dim, inter, "s_w2");
  w->s_w3 = random_weight(d, reference::DType::kF8E4M3, inter, dim, "s_w3");
  reference::MoeRouting r{Tensor<int32_t>({T, k}, "experts"), Tensor<float>({T, k}, "weights"), Tensor<float>({T, E}, "scores")};
  for (int64_t t = 0; t < T; ++t) {
    const int64_t first = static_cast<int64_t>(d.bits() % static_cast<uint64_t>(E));
    for (int j = 0; j < k; ++j) {
      r.experts.at(t, j) = static_cast<int32_t>((first + j) % E);
      r.weights.at(t, j) = static_cast<float>(0.2 + d.uniform());
    }
  }
  out.push_back(experts_case("random", bf16_tensor(d, {T, dim}, 1.0, "x"), w, r, cfg));
}

}  // namespace dsv41::scenarios::exact
