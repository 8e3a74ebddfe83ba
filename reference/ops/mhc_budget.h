// reference/ops/mhc_budget.h
//
// The error budget of the mHC mixes against the official code (docs/mhc.md, "Tolerance of
// hc_mixes"): the only step of hc_mixes whose order cannot be pinned is the official fp32
// F.linear(x, hc_fn) (MKL, K = hc*dim, a blocking-dependent order); the reference takes the double
// sum rounded once. Per mix k the probabilistic bound of a K-term fp32 dot (Higham & Mary 2019,
// exceeded with probability <= 2 exp(-lambda^2 / 2) per dot, lambda = kMixesLambda):
//   dm_k = lambda * sqrt(K) * u * sum_i |x_i fn_ki| * r          (r: the rms scale of the row)
// reaches the outputs to first order:
//   pre_i:   |s0| s(1 - s) dm_i + 2 ulp          post_i: 2 |s1| s(1 - s) dm_{hc+i} + 2 ulp
//   comb_j:  sum_k |d comb_j / d l_k| (|s2| dm_{2hc+k} + 2u) + kMixesCombRoundingUlp ulp
// (sigmoid slopes in double; the comb Jacobian by central differences of a double-precision
// Sinkhorn; 2 ulp for the roundings of z and of the sigmoid, 2u for the official exp per logit,
// 8 ulp for the fp32 roundings of the Sinkhorn iterations on perturbed inputs).
//
// Example:
//   MixesBudget b = hc_mixes_budget(stream, w.fn.data(), w.scale.data(), w.base.data(), c.norm_eps,
//                                   c.hc_sinkhorn_iters, c.hc_eps);
//   ok = |ours.pre.at(t, i) - official.pre.at(t, i)| <= b.pre[t * hc + i];
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/mhc.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference {

inline constexpr double kMixesLambda = 7.0;
inline constexpr double kMixesCombRoundingUlp = 8.0;

// Allowed |ours - official| per value, row-major like HcMixes: pre, post [T, hc], comb [T, hc, hc].
struct MixesBudget {
  std::vector<double> pre, post, comb;
};

// The budget of the mixes of `stream` ([T, hc, dim] bf16) under weights fn [(2+hc)*hc, hc*dim],
// scale [3], base [(2+hc)*hc]; `official` supplies the values whose ulps enter the budget.
MixesBudget hc_mixes_budget(const Tensor<float>& stream, const std::vector<float>& fn, const std::vector<float>& scale,
                            const std::vector<float>& base, double norm_eps, int iters, double hc_eps,
                            const HcMixes& official);

// max over values of |ours - official| / budget (<= 1: within). NaN anywhere gives +inf.
double mixes_budget_ratio(const HcMixes& ours, const HcMixes& official, const MixesBudget& budget);

}  // namespace dsv41::reference
