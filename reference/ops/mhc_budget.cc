#include "reference/ops/mhc_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"

namespace dsv41::reference {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of fp32

double ulp_of(float v) { return std::nextafter(std::fabs(v), HUGE_VALF) - std::fabs(v); }

// The comb of one token in double precision (the official formula without fp32 roundings).
std::vector<double> sinkhorn_f64(const std::vector<double>& logits, int hc, int iters, double eps) {
  std::vector<double> c(logits.size());
  for (int i = 0; i < hc; ++i) {
    const double mx = *std::max_element(logits.begin() + i * hc, logits.begin() + (i + 1) * hc);
    double s = 0;
    for (int j = 0; j < hc; ++j) s += c[i * hc + j] = std::exp(logits[i * hc + j] - mx);
    for (int j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / s + eps;
  }
  const auto rows = [&] {
    for (int i = 0; i < hc; ++i) {
      double s = eps;
      for (int j = 0; j < hc; ++j) s += c[i * hc + j];
      for (int j = 0; j < hc; ++j) c[i * hc + j] /= s;
    }
  };
  const auto cols = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = eps;
      for (int i = 0; i < hc; ++i) s += c[i * hc + j];
      for (int i = 0; i < hc; ++i) c[i * hc + j] /= s;
    }
  };
  cols();
  for (int it = 1; it < iters; ++it) rows(), cols();
  return c;
}

}  // namespace

MixesBudget hc_mixes_budget(const Tensor<float>& stream, const std::vector<float>& fn, const std::vector<float>& scale,
                            const std::vector<float>& base, double norm_eps, int iters, double hc_eps,
                            const HcMixes& official) {
  DSV41_CHECK(stream.rank() == 3 && scale.size() == 3, "hc_mixes_budget: stream ", shape_string(stream.shape()));
  const int64_t T = stream.dim(0), hc = stream.dim(1), K = hc * stream.dim(2), n_mix = hc_mix_count(hc), C = hc * hc;
  DSV41_CHECK(official.pre.shape() == std::vector<int64_t>({T, hc}) && official.comb.numel() == T * C,
              "hc_mixes_budget: official mixes ", shape_string(official.pre.shape()), " for ", T, " tokens");
  const Tensor<float> raw = hc_raw_mixes(stream, fn, norm_eps);
  MixesBudget b;
  b.pre.resize(static_cast<size_t>(T * hc));
  b.post.resize(static_cast<size_t>(T * hc));
  b.comb.assign(static_cast<size_t>(T * C), 0.0);
  std::vector<double> dm(static_cast<size_t>(n_mix));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = stream.row(t, 0);
    double ss = 0;
    for (int64_t i = 0; i < K; ++i) ss += double{x[i]} * x[i];
    for (int64_t k = 0; k < n_mix; ++k) {
      double a = 0;
      for (int64_t i = 0; i < K; ++i) a += std::fabs(double{x[i]} * fn[static_cast<size_t>(k * K + i)]);
      dm[static_cast<size_t>(k)] = kMixesLambda * std::sqrt(double(K)) * kU * a / std::sqrt(ss / double(K));
    }
    for (int64_t k = 0; k < 2 * hc; ++k) {  // pre (k < hc), then post
      const int64_t part = k / hc, i = k % hc;
      const double z = double{raw.at(t, k)} * scale[static_cast<size_t>(part)] + base[static_cast<size_t>(k)];
      const double sg = 1 / (1 + std::exp(-z)), gain = double(1 + part) * std::fabs(scale[static_cast<size_t>(part)]);
      const float w = (part ? official.post : official.pre).at(t, i);
      (part ? b.post : b.pre)[static_cast<size_t>(t * hc + i)] =
          gain * sg * (1 - sg) * dm[static_cast<size_t>(k)] + 2 * ulp_of(w);
    }
    std::vector<double> l(static_cast<size_t>(C));
    for (int64_t k = 0; k < C; ++k) {
      l[static_cast<size_t>(k)] = double{raw.at(t, 2 * hc + k)} * scale[2] + base[static_cast<size_t>(2 * hc + k)];
    }
    double* allowed = b.comb.data() + t * C;
    for (int64_t k = 0; k < C; ++k) {  // column k of the Jacobian, by central differences
      constexpr double kStep = 1e-4;
      std::vector<double> lp = l, lm = l;
      lp[static_cast<size_t>(k)] += kStep;
      lm[static_cast<size_t>(k)] -= kStep;
      const std::vector<double> cp = sinkhorn_f64(lp, static_cast<int>(hc), iters, hc_eps);
      const std::vector<double> cm = sinkhorn_f64(lm, static_cast<int>(hc), iters, hc_eps);
      const double dl = std::fabs(scale[2]) * dm[static_cast<size_t>(2 * hc + k)] + 2 * kU;  // + exp's 1 ulp
      for (int64_t j = 0; j < C; ++j) {
        allowed[j] += std::fabs(cp[static_cast<size_t>(j)] - cm[static_cast<size_t>(j)]) / (2 * kStep) * dl;
      }
    }
    for (int64_t j = 0; j < C; ++j) allowed[j] += kMixesCombRoundingUlp * ulp_of(official.comb.row(t, 0)[j]);
  }
  return b;
}

double mixes_budget_ratio(const HcMixes& ours, const HcMixes& official, const MixesBudget& budget) {
  double worst = 0;
  const auto part = [&](const Tensor<float>& a, const Tensor<float>& b, const std::vector<double>& allowed) {
    DSV41_CHECK(a.numel() == b.numel() && static_cast<size_t>(a.numel()) == allowed.size(),
                "mixes_budget_ratio: sizes ", a.numel(), ", ", b.numel(), ", ", allowed.size());
    for (size_t i = 0; i < allowed.size(); ++i) {
      const double d = std::fabs(double{a.data()[i]} - b.data()[i]);
      worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d / allowed[i]);
    }
  };
  part(ours.pre, official.pre, budget.pre);
  part(ours.post, official.post, budget.post);
  part(ours.comb, official.comb, budget.comb);
  return worst;
}

}  // namespace dsv41::reference
