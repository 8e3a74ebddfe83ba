// moe_gate of the exact evaluation (scenarios/exact/exact_eval.h): the sqrt-softplus scores, the
// routing weights, and the expert choice compared tie-aware; bounds docs/cuda.md "Tolerances
// with their origin".
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/moe.h"
#include "scenarios/exact/exact_internal.h"

namespace dsv41::scenarios::exact {
namespace {

using reference::Tensor;

// Per token, the outputs are: the E scores s = sqrt(softplus(x . W_e / temp)) (fp32), the k
// routing weights of the side's own choice (route_scale s_e / (sum s + 1e-20f), fp32), and one
// flag per token, 1 when the choice leaves out an expert that is certainly in the top k, or takes
// one that is certainly out (intervals of the biased scores +- their bound; ties inside the band
// are free), exact value 0 and bound 0.
//
// Score bound: the logit is an fp32 FMA chain (dv = gamma_dim(u32) sum|x w|, + u|v| for / temp
// unless temp == 1); softplus = log1p(expf(v)) with expf and log1p within 1 ulp:
// dsp = sig(v + dv) (dv + 2u) + 2u (sp + dv), = dv for v > 20, + e^-20 when the threshold 20 lies
// within dv of v; sqrt: ds = dsp / (sqrt(sp - dsp) + sqrt(sp)) + u (s + ds).
// Weight bound: eps = max_j ds_j / s_j over the chosen; rel (1 + eps)(1 + u)^2 / ((1 - eps)(1 - gamma_k)) - 1.
OpCase gate_case(const std::string& inputs, const Tensor<float>& x,
                 const std::shared_ptr<const reference::MoeWeights>& wp, const reference::ModelConfig& cfg, int layer) {
  const reference::MoeWeights& w = *wp;
  const int64_t T = x.dim(0), dim = x.dim(1), E = w.gate.out;
  const int k = reference::moe_activated_experts(cfg, layer);
  const double u = kU32;
  const float temp = static_cast<float>(cfg.gate_temp);
  OpCase c;
  c.op = "moe_gate";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = dim;
  c.out = kF32;
  c.precisions = "x bf16 -> fp32, gate bf16 -> fp32; fp32 FMA logits, expf/log1pf/sqrtf, fp32 weights";
  c.formula = "scores: ds (sqrt-softplus through dv = gamma_dim(u32) sum|x w|); weights: relative; choice: tie-aware, 0";
  const ExactMatrix xm = exact_matrix(x.data().data(), T, dim), wm = exact_matrix(w.gate.w.data(), E, dim);
  const ExactMatrix logits = xm * wm.transpose(), mag = abs_of(xm) * abs_of(wm).transpose();
  std::vector<Exact> scores(static_cast<size_t>(T * E));
  std::vector<double> ds(scores.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const Exact v = logits(t, e) / exact_of(temp);
      const double vd = to_double(v);
      const double dv = gamma(dim, u) * to_double(mag(t, e)) + (temp == 1.0f ? 0.0 : u * std::fabs(vd));
      const Exact sp = v > 20 ? v : Exact(mp::log1p(mp::exp(v)));
      const double spd = to_double(sp);
      double dsp = vd > 20 ? dv : 1 / (1 + std::exp(-(vd + dv))) * (dv + 2 * u) + 2 * u * (spd + dv);
      if (std::fabs(vd - 20) <= dv) dsp += std::exp(-20.0);
      const Exact s = mp::sqrt(sp);
      const double sd = to_double(s);
      double d = spd > dsp ? dsp / (std::sqrt(spd - dsp) + sd) : std::sqrt(dsp);
      d += u * (sd + d);
      scores[static_cast<size_t>(t * E + e)] = s;
      ds[static_cast<size_t>(t * E + e)] = d;
      c.exact.push_back(s);
      c.bound.push_back(d);
    }
  }
  const std::shared_ptr<const reference::MoeWeights> weights = wp;
  const reference::ModelConfig config = cfg;
  // The reference's choice defines the weights' slots; a side with another choice outside the
  // tie band is flagged by its per-token flag.
  const reference::MoeRouting ref_route = reference::seam::reference_ops().moe_gate(x, w, cfg, layer);
  for (int64_t t = 0; t < T; ++t) {
    Exact sum = 0;
    double eps = 0;
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t * E + ref_route.experts.at(t, j));
      sum += scores[i];
      eps = std::max(eps, ds[i] / to_double(scores[i]));
    }
    const double rel = (1 + eps) * (1 + u) * (1 + u) / ((1 - eps) * (1 - gamma(k, u))) - 1;
    for (int j = 0; j < k; ++j) {
      const Exact wt = scores[static_cast<size_t>(t * E + ref_route.experts.at(t, j))] / (sum + exact_of(1e-20f)) *
                       exact_of(static_cast<float>(cfg.route_scale));
      c.exact.push_back(wt);
      c.bound.push_back(rel * to_double(wt));
    }
  }
  // Certainly-in / certainly-out experts per token from the biased intervals (tie-aware).
  std::vector<int8_t> sure;  // [T, E]: 1 in, -1 out, 0 free (tie band)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> lo(static_cast<size_t>(E)), hi(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const size_t i = static_cast<size_t>(t * E + e);
      const double b = to_double(scores[i] + exact_of(w.gate_bias.data()[static_cast<size_t>(e)]));
      const double r = ds[i] + u * std::fabs(b);
      lo[static_cast<size_t>(e)] = b - r;
      hi[static_cast<size_t>(e)] = b + r;
    }
    const std::vector<int8_t> m = topk_membership(lo, hi, k);
    sure.insert(sure.end(), m.begin(), m.end());
  }
  for (int64_t t = 0; t < T; ++t) {
    c.exact.push_back(Exact(0));
    c.bound.push_back(0.0);
  }
  c.run = [x, weights, config, layer, T, E, k, sure, ref_route](const reference::seam::Ops& ops) {
    reference::MoeRouting r = ops.moe_gate(ops.upload(x), *weights, config, layer);
    const Tensor<float> s = ops.download(r.scores), wt = ops.download(r.weights);
    const Tensor<int32_t> ex = ops.download(r.experts);
    std::vector<float> outv = s.data();
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        // The weight of the reference's j-th expert in this side's routing (NaN if not chosen).
        float v = std::nanf("");
        for (int j2 = 0; j2 < k; ++j2) {
          if (ex.at(t, j2) == ref_route.experts.at(t, j)) v = wt.at(t, j2);
        }
        outv.push_back(v);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      float flag = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        bool chosen = false;
        for (int j = 0; j < k; ++j) chosen = chosen || ex.at(t, j) == e;
        const int8_t su = sure[static_cast<size_t>(t * E + e)];
        if ((su == 1 && !chosen) || (su == -1 && chosen)) flag = 1.0f;
      }
      outv.push_back(flag);
    }
    return outv;
  };
  return c;
}

}  // namespace

void add_moe_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out) {
  const bool small = sizes == Sizes::kSmall;
  const reference::ModelConfig cfg = reference::load_config("tiny");
  auto w = std::make_shared<reference::MoeWeights>();
  Draws d(seed, "moe_gate");
  const int64_t E = cfg.n_routed_experts, dim = cfg.dim, T = small ? 32 : 8;
  w->gate.name = "gate";
  w->gate.dtype = reference::DType::kBF16;
  w->gate.out = E;
  w->gate.in = dim;
  w->gate.w.resize(static_cast<size_t>(E * dim));
  for (float& v : w->gate.w) v = d.bf16(1.0 / std::sqrt(static_cast<double>(dim)));
  w->gate_bias = Tensor<float>({E}, "gate.bias");
  for (float& v : w->gate_bias.data()) v = d.f32(0.01);
  out.push_back(gate_case("random", bf16_tensor(d, {T, dim}, 1.0, "x"), w, cfg, 2));
  // Ties: identical gate rows and zero bias, so several experts score exactly the same.
  auto tw = std::make_shared<reference::MoeWeights>(*w);
  for (int64_t e = 1; e < E; e += 2) {
    std::copy(tw->gate.w.begin() + (e - 1) * dim, tw->gate.w.begin() + e * dim, tw->gate.w.begin() + e * dim);
  }
  for (float& v : tw->gate_bias.data()) v = 0.0f;
  out.push_back(gate_case("ties", bf16_tensor(d, {T, dim}, 1.0, "x"), tw, cfg, 2));
}

}  // namespace dsv41::scenarios::exact
