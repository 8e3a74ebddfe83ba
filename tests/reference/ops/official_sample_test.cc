// reference/ops/sampling.h, the official sampler (what the DSpark draft draws with):
//   - temperature 0: the argmax, lowest index among equal maxima; a one-hot distribution;
//   - temperature T: the draw is argmax(probs / e) with the documented Exp(1) draws, and the
//     frequencies of many draws match softmax(logits / T);
//   - the distribution is the softmax of logits / max(T, 1e-5); bad inputs are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"
#include "reference/ops/sampling.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

TEST(Sample, TemperatureZeroIsTheLowestArgmax) {
  const std::vector<float> x = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  std::mt19937_64 rng(1);
  const std::mt19937_64 untouched = rng;
  EXPECT_EQ(sample(x.data(), 5, 0.0, rng), 1);
  EXPECT_EQ(rng, untouched) << "temperature 0 draws nothing";
  EXPECT_EQ(sampling_probs(x.data(), 5, 0.0), (std::vector<float>{0, 1, 0, 0, 0}));
}

TEST(Sample, ADrawIsTheGumbelMaxOfTheDocumentedExpDraws) {
  const std::vector<float> x = {0.3f, -1.0f, 2.0f, 1.7f, 0.0f, 1.9f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::mt19937_64 a(seed), b(seed);
    const int64_t got = sample(x.data(), 6, 0.7, a);
    const std::vector<float> p = sampling_probs(x.data(), 6, 0.7);
    int64_t want = 0;
    float best = -1;
    for (int64_t v = 0; v < 6; ++v) {
      const double u = (static_cast<double>(b() >> 11) + 0.5) * 0x1p-53;
      const float q = p[static_cast<size_t>(v)] / static_cast<float>(-std::log1p(-u));
      if (q > best) {
        best = q;
        want = v;
      }
    }
    EXPECT_EQ(got, want) << "seed " << seed;
    EXPECT_EQ(a, b) << "one draw per vocab entry";
  }
}

TEST(Sample, FrequenciesFollowTheDistribution) {
  const std::vector<float> x = {0.0f, 1.0f, -0.5f, 2.0f};
  const double T = 1.3;
  const std::vector<float> p = sampling_probs(x.data(), 4, T);
  double z = 0;
  for (float v : x) z += std::exp(v / T);
  for (size_t v = 0; v < x.size(); ++v) EXPECT_NEAR(p[v], std::exp(x[v] / T) / z, 1e-6);
  std::mt19937_64 rng(test::seed_for("sampling/frequencies"));
  constexpr int kDraws = 40000;
  std::vector<int> n(4, 0);
  for (int i = 0; i < kDraws; ++i) ++n[static_cast<size_t>(sample(x.data(), 4, T, rng))];
  for (size_t v = 0; v < 4; ++v) {
    const double sigma = std::sqrt(kDraws * p[v] * (1 - p[v]));
    EXPECT_NEAR(n[v], kDraws * p[v], 5 * sigma) << "token " << v;  // 5 sigma: a fixed seed, no flakes
  }
}

TEST(Sample, TinyTemperaturesUseTheOfficialFloor) {
  const std::vector<float> x = {0.0f, 1e-5f};
  EXPECT_EQ(sampling_probs(x.data(), 2, 1e-9), sampling_probs(x.data(), 2, 1e-5));
}

TEST(Sample, BadInputsAreErrors) {
  const std::vector<float> x = {0.0f, INFINITY};
  std::mt19937_64 rng(0);
  EXPECT_THROW(sample(x.data(), 2, 1.0, rng), Error);
  EXPECT_THROW(sampling_probs(x.data(), 1, -1.0), Error);
  EXPECT_THROW(sampling_probs(x.data(), 0, 1.0), Error);
}

}  // namespace
}  // namespace dsv41::reference
