#include "reference/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "formats/error.h"

namespace dsv41::reference {

int64_t argmax_token(const float* logits, int64_t vocab) {
  DSV41_CHECK(vocab > 0, "argmax over an empty vocab");
  int64_t best = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    DSV41_CHECK(!std::isnan(logits[i]), "argmax: logit ", i, " is NaN");
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

std::vector<double> target_distribution(const float* logits, int64_t vocab, const SamplingParams& s) {
  DSV41_CHECK(s.temperature >= 0 && std::isfinite(s.temperature), "sampling: temperature ", s.temperature,
              " must be a finite number >= 0");
  DSV41_CHECK(s.top_p > 0 && s.top_p <= 1, "sampling: top_p ", s.top_p, " must be in (0, 1]");
  std::vector<double> p(static_cast<size_t>(vocab), 0.0);
  if (s.temperature == 0) {
    p[static_cast<size_t>(argmax_token(logits, vocab))] = 1.0;
    return p;
  }
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    DSV41_CHECK(!std::isnan(logits[i]), "sampling: logit ", i, " is NaN");
    mx = std::max(mx, static_cast<double>(logits[i]) / s.temperature);
  }
  DSV41_CHECK(std::isfinite(mx), "sampling: no finite logit");
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += p[static_cast<size_t>(i)] = std::exp(double{logits[i]} / s.temperature - mx);
  for (double& v : p) v /= total;
  if (s.top_p < 1) {
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&p](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
    double mass = 0;
    size_t keep = 0;
    while (keep < order.size() && mass < s.top_p) mass += p[static_cast<size_t>(order[keep++])];
    std::vector<double> q(p.size(), 0.0);
    for (size_t i = 0; i < keep; ++i) q[static_cast<size_t>(order[i])] = p[static_cast<size_t>(order[i])] / mass;
    p = std::move(q);
  }
  return p;
}

int64_t sample_from(const std::vector<double>& p, SampleRng& rng) {
  double total = 0;
  for (double v : p) {
    DSV41_CHECK(v >= 0 && std::isfinite(v), "sampling: a probability ", v, " is negative or not finite");
    total += v;
  }
  DSV41_CHECK(total > 0, "sampling: the distribution has no mass");
  const double u = rng.uniform() * total;
  double cum = 0;
  int64_t last = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = static_cast<int64_t>(i);
    cum += p[i];
    if (u < cum) return last;
  }
  return last;  // u at the very top of the mass: the last token with mass
}

}  // namespace dsv41::reference
