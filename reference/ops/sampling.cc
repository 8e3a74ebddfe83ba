#include "reference/ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace dsv41::reference {
namespace {

void check(const float* logits, int64_t vocab, double temperature) {
  DSV41_CHECK(vocab > 0 && logits != nullptr, "sample: empty logits");
  DSV41_CHECK(std::isfinite(temperature) && temperature >= 0.0, "sample: temperature ", temperature,
              " (want a finite value >= 0)");
  for (int64_t v = 0; v < vocab; ++v) {
    DSV41_CHECK(std::isfinite(logits[v]), "sample: logit ", v, " = ", logits[v], " is not finite");
  }
}

// The first index of the largest value.
template <typename T>
int64_t argmax_lowest(const T* x, int64_t n) {
  int64_t best = 0;
  for (int64_t v = 1; v < n; ++v) {
    if (x[v] > x[best]) best = v;
  }
  return best;
}

}  // namespace

float exp1_draw(std::mt19937_64& rng) {
  const double u = (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53;  // (0, 1)
  return static_cast<float>(-std::log1p(-u));
}

std::vector<float> sampling_probs(const float* logits, int64_t vocab, double temperature) {
  check(logits, vocab, temperature);
  std::vector<float> p(static_cast<size_t>(vocab), 0.0f);
  if (temperature == 0.0) {
    p[static_cast<size_t>(argmax_lowest(logits, vocab))] = 1.0f;
    return p;
  }
  const float t = static_cast<float>(std::max(temperature, 1e-5));
  std::vector<float> z(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) z[static_cast<size_t>(v)] = logits[v] / t;
  const float m = *std::max_element(z.begin(), z.end());
  std::vector<double> e(z.size());
  double s = 0.0;
  for (size_t v = 0; v < z.size(); ++v) {
    e[v] = std::exp(static_cast<double>(z[v] - m));
    s += e[v];
  }
  for (size_t v = 0; v < z.size(); ++v) p[v] = static_cast<float>(e[v] / s);
  return p;
}

int64_t sample(const float* logits, int64_t vocab, double temperature, std::mt19937_64& rng) {
  if (temperature == 0.0) {
    check(logits, vocab, temperature);
    return argmax_lowest(logits, vocab);
  }
  const std::vector<float> p = sampling_probs(logits, vocab, temperature);
  std::vector<float> q(p.size());
  for (size_t v = 0; v < p.size(); ++v) q[v] = p[v] / exp1_draw(rng);
  return argmax_lowest(q.data(), vocab);
}

int64_t argmax_token(const float* logits, int64_t vocab) {
  DSV41_CHECK(vocab > 0, "argmax over an empty vocab");
  for (int64_t i = 0; i < vocab; ++i) DSV41_CHECK(!std::isnan(logits[i]), "argmax: logit ", i, " is NaN");
  return argmax_lowest(logits, vocab);
}

std::vector<double> target_distribution(const float* logits, int64_t vocab, const SamplingParams& s) {
  DSV41_CHECK(s.temperature >= 0 && std::isfinite(s.temperature), "sampling: temperature ", s.temperature,
              " must be a finite number >= 0");
  DSV41_CHECK(s.top_p > 0 && s.top_p <= 1, "sampling: top_p ", s.top_p, " must be in (0, 1]");
  for (int64_t i = 0; i < vocab; ++i) DSV41_CHECK(!std::isnan(logits[i]), "sampling: logit ", i, " is NaN");
  const std::vector<float> official = sampling_probs(logits, vocab, s.temperature);
  std::vector<double> p(official.begin(), official.end());
  // The kept tokens (all of them at top_p = 1), renormalized in double: the official fp32
  // probabilities sum to 1 only within their rounding.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&p](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
  double mass = 0;
  size_t keep = 0;
  while (keep < order.size() && (s.top_p == 1 || mass < s.top_p)) mass += p[static_cast<size_t>(order[keep++])];
  std::vector<double> q(p.size(), 0.0);
  for (size_t i = 0; i < keep; ++i) q[static_cast<size_t>(order[i])] = p[static_cast<size_t>(order[i])] / mass;
  p = std::move(q);
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
