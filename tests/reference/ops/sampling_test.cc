// reference/ops/sampling: the argmax tie rule, temperature and top-p (target_distribution), the
// seeded stream (SampleRng) and inverse-CDF sampling (sample_from).
//
// Expected values come from the definitions in reference/ops/sampling.h, restated independently here
// (std::max_element for the argmax, a per-token "mass ranked before it" rule for top-p, the C++
// standard's own check value for mt19937_64), never from the code under test. Random inputs come
// from the printed data seed (DSV41_SEED=<n> overrides it).
//
// sample_from's frequencies: N = 200000 draws from an 8-token distribution with two zero entries,
// Pearson chi-square over the 6 tokens with mass (df 5) against the critical value at
// alpha = 1e-6 (boost::math, about 35.9): a correct sampler fails with probability 1e-6.
#include "reference/ops/sampling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/math/distributions/chi_squared.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/support/error_of.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

using ::testing::HasSubstr;
using test::error_of;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<double> dist(const std::vector<float>& logits, double temperature, double top_p) {
  return target_distribution(logits.data(), static_cast<int64_t>(logits.size()), {temperature, top_p});
}

// ---- argmax ----

TEST(SamplingArgmax, TakesTheLowestIdAmongEqualMaxima) {
  const std::vector<std::vector<float>> cases = {
      {1, 3, 3, 2, 3}, {5, 5}, {-kInf, -kInf, -kInf}, {kInf, 1, kInf}, {-0.0f, 0.0f}, {0.0f, -0.0f}, {-7}};
  for (const auto& l : cases) {
    const auto expect = std::max_element(l.begin(), l.end()) - l.begin();  // the first largest
    EXPECT_EQ(argmax_token(l.data(), static_cast<int64_t>(l.size())), expect) << "logits[0] " << l[0];
  }
  // Random rows on a coarse grid, so that many rows hold ties at the maximum.
  std::mt19937_64 rng(test::seed_for("argmax/coarse"));
  int tied_rows = 0;
  for (int row = 0; row < 2000; ++row) {
    std::vector<float> l(1 + rng() % 40);
    for (float& v : l) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    const float mx = *std::max_element(l.begin(), l.end());
    tied_rows += std::count(l.begin(), l.end(), mx) > 1;
    ASSERT_EQ(argmax_token(l.data(), static_cast<int64_t>(l.size())), std::max_element(l.begin(), l.end()) - l.begin());
  }
  EXPECT_GT(tied_rows, 500);  // the rule was exercised
}

TEST(SamplingArgmax, NaNIsAnErrorNamingTheToken) {
  const std::vector<float> l = {1, 2, kNaN, 9};
  EXPECT_THAT(error_of([&] { argmax_token(l.data(), 4); }), HasSubstr("logit 2 is NaN"));
  EXPECT_THAT(error_of([&] { dist(l, 0.0, 1.0); }), HasSubstr("NaN"));  // greedy
  EXPECT_THAT(error_of([&] { dist(l, 0.7, 1.0); }), HasSubstr("NaN"));  // sampling
  EXPECT_THAT(error_of([&] { argmax_token(l.data(), 0); }), HasSubstr("empty"));
}

// ---- target_distribution ----

TEST(SamplingTarget, TemperatureZeroIsTheOneHotOfTheArgmax) {
  const std::vector<float> l = {0.5f, 4, -1, 4, 3.99f};
  const std::vector<double> p = dist(l, 0.0, 1.0);
  ASSERT_EQ(p.size(), l.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i], i == 1 ? 1.0 : 0.0) << "token " << i;
  EXPECT_EQ(dist(l, 0.0, 0.01), p);  // top-p does not matter for a one-hot
}

TEST(SamplingTarget, TemperatureScalesTheLogitsOfASoftmax) {
  std::mt19937_64 rng(test::seed_for("target/temperature"));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(64);
  for (float& v : l) v = normal(rng);
  for (double t : {0.25, 0.8, 1.0, 2.5}) {
    const std::vector<double> p = dist(l, t, 1.0);
    double total = 0;
    for (double v : p) {
      ASSERT_GT(v, 0.0);
      total += v;
    }
    EXPECT_NEAR(total, 1.0, 1e-12) << "T " << t;
    // p_i / p_0 = exp((l_i - l_0) / T), within the official sampler's fp32 steps: z = l / T and
    // z_i - max z rounded to fp32 (each 2^-24 relative), and p rounded to fp32 (2^-24 each).
    for (size_t i = 1; i < l.size(); ++i) {
      const double want = std::exp((double{l[i]} - double{l[0]}) / t);
      const double zi = std::fabs(l[i] / t), z0 = std::fabs(l[0] / t), zmax = 40.0 / t;
      const double bound = 0x1p-24 * (2 * (zi + z0) + 2 * (zi + z0 + 2 * zmax) + 4);
      EXPECT_NEAR(p[i] / p[0], want, bound * want) << "T " << t << " token " << i;
    }
  }
}

// p = {0.1, 0.4, 0.2, 0.2, 0.1} as logits log p: ranked 1 (0.4), 2, 3 (0.2 each: ties by lower
// id), 0, 4 (0.1 each); cumulative 0.4, 0.6, 0.8, 0.9, 1.0.
TEST(SamplingTarget, TopPKeepsTheShortestPrefixTiesByLowerIdAndRenormalizes) {
  const std::vector<float> l = {std::log(0.1f), std::log(0.4f), std::log(0.2f), std::log(0.2f), std::log(0.1f)};
  const std::vector<double> full = dist(l, 1.0, 1.0);
  ASSERT_EQ(full[2], full[3]);  // exact ties
  ASSERT_EQ(full[0], full[4]);
  const std::vector<std::pair<double, std::vector<int>>> cases = {
      {0.3, {1}}, {0.5, {1, 2}}, {0.7, {1, 2, 3}}, {0.85, {0, 1, 2, 3}}, {0.95, {0, 1, 2, 3, 4}}, {1.0, {0, 1, 2, 3, 4}}};
  for (const auto& [top_p, kept] : cases) {
    const std::vector<double> q = dist(l, 1.0, top_p);
    double mass = 0;
    for (int i : kept) mass += full[static_cast<size_t>(i)];
    for (size_t i = 0; i < q.size(); ++i) {
      const bool in = std::find(kept.begin(), kept.end(), static_cast<int>(i)) != kept.end();
      EXPECT_NEAR(q[i], in ? full[i] / mass : 0.0, 1e-15) << "top_p " << top_p << " token " << i;
      if (!in) {
        EXPECT_EQ(q[i], 0.0);
      }
    }
  }
  // Equal logits: p = 1/4 exactly, so the prefix mass reaches top_p exactly (>= stops there).
  EXPECT_EQ(dist({2, 2, 2, 2}, 1.0, 0.5), (std::vector<double>{0.5, 0.5, 0, 0}));
  EXPECT_EQ(dist({2, 2, 2, 2}, 1.0, 0.25), (std::vector<double>{1, 0, 0, 0}));
}

// Random logits on a coarse grid (ties), random top_p: token i is kept iff the mass of the tokens
// ranked before it (higher p, or equal p and lower id) is < top_p. Draws whose top_p lies within
// 1e-9 of such a mass are skipped (the two summation orders may round differently there).
TEST(SamplingTarget, TopPMatchesTheRankedMassRuleOnRandomRows) {
  std::mt19937_64 rng(test::seed_for("target/top_p"));
  int checked = 0, partial = 0;
  for (int row = 0; row < 300; ++row) {
    std::vector<float> l(2 + rng() % 60);
    for (float& v : l) v = static_cast<float>(static_cast<int>(rng() % 9)) * 0.5f;
    const double t = 0.5 + static_cast<double>(rng() % 100) / 50.0;
    const double top_p = static_cast<double>(1 + rng() % 1000) / 1000.0;
    const std::vector<double> full = dist(l, t, 1.0), q = dist(l, t, top_p);
    std::vector<bool> keep(l.size());
    bool near_boundary = false;
    double kept_mass = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      double before = 0;
      for (size_t j = 0; j < l.size(); ++j) before += (full[j] > full[i] || (full[j] == full[i] && j < i)) ? full[j] : 0;
      near_boundary |= std::fabs(before - top_p) < 1e-9;
      keep[i] = before < top_p;
      kept_mass += keep[i] ? full[i] : 0;
    }
    if (near_boundary) continue;
    ++checked;
    partial += kept_mass < 1 - 1e-12;
    for (size_t i = 0; i < l.size(); ++i) {
      ASSERT_NEAR(q[i], keep[i] ? full[i] / kept_mass : 0.0, 1e-12) << "row " << row << " token " << i << " top_p " << top_p;
    }
  }
  EXPECT_GT(checked, 250);
  EXPECT_GT(partial, 100);  // most rows truncate
}

TEST(SamplingTarget, BadTemperatureOrTopPIsAnErrorNamingTheValue) {
  const std::vector<float> l = {1, 2, 3};
  for (double t : {-0.5, -1e-300, static_cast<double>(kNaN), static_cast<double>(kInf)}) {
    EXPECT_THAT(error_of([&] { dist(l, t, 1.0); }), HasSubstr("temperature")) << t;
  }
  for (double p : {0.0, -0.1, 1.0000001, 2.0, static_cast<double>(kNaN), static_cast<double>(kInf)}) {
    EXPECT_THAT(error_of([&] { dist(l, 0.8, p); }), HasSubstr("top_p")) << p;
  }
  EXPECT_THAT(error_of([&] { dist(l, 0.0, 0.0); }), HasSubstr("top_p"));  // checked in greedy mode too
  EXPECT_THAT(error_of([&] { dist({-kInf, -kInf}, 1.0, 1.0); }), HasSubstr("is not finite"));
}

// ---- SampleRng ----

TEST(SamplingRng, IsTheStandardMt19937_64) {
  SampleRng r(5489);  // the default seed: the standard fixes its 10000th output ([rand.predef])
  uint64_t v = 0;
  for (int i = 0; i < 10000; ++i) v = r.next();
  EXPECT_EQ(v, 9981545732273789042ull);
  const uint64_t seed = test::seed_for("rng/engine");
  std::printf("[dsv41] SampleRng seed %llu\n", static_cast<unsigned long long>(seed));
  SampleRng a(seed), b(seed), c(seed + 1);
  std::mt19937_64 engine(seed);
  EXPECT_EQ(a.seed(), seed);
  int differ = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.next();
    ASSERT_EQ(x, engine());
    ASSERT_EQ(x, b.next());  // the same seed replays
    differ += x != c.next();
  }
  EXPECT_GT(differ, 990);  // another seed is another stream
}

TEST(SamplingRng, UniformUsesTheTop53BitsAndStaysBelowOne) {
  const uint64_t seed = test::seed_for("rng/uniform");
  SampleRng r(seed);
  std::mt19937_64 engine(seed);
  constexpr int kDraws = 100000;
  int odd = 0, below_2_32 = 0;
  double sum = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = r.uniform();
    const uint64_t top = engine() >> 11;
    ASSERT_EQ(u, std::ldexp(static_cast<double>(top), -53)) << "draw " << i;
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double scaled = std::ldexp(u, 53);  // an integer in [0, 2^53)
    ASSERT_EQ(scaled, std::floor(scaled));
    odd += std::fmod(scaled, 2.0) == 1.0;  // the 53rd bit is used
    below_2_32 += u < 0x1p-32;
    sum += u;
  }
  // Fair bits: odd ~ Binomial(N, 1/2), mean ~ N(1/2, 1/(12 N)); 6 sigma bounds.
  EXPECT_NEAR(odd, kDraws / 2, 6 * std::sqrt(kDraws / 4.0));
  EXPECT_NEAR(sum / kDraws, 0.5, 6 * std::sqrt(1.0 / (12.0 * kDraws)));
  EXPECT_LE(below_2_32, 1);
  // The largest value the formula can give is 1 - 2^-53 < 1.
  EXPECT_LT(std::ldexp(static_cast<double>(~uint64_t{0} >> 11), -53), 1.0);
}

// ---- sample_from ----

TEST(SamplingSampleFrom, IsTheInverseCdfOfOneUniformInIdOrder) {
  const std::vector<double> p = {0.0, 2.0, 0.5, 0.0, 1.5};  // unnormalized: u is scaled by the total 4
  const uint64_t seed = test::seed_for("sample_from/inverse_cdf");
  SampleRng r(seed), u(seed);
  for (int i = 0; i < 5000; ++i) {
    const double x = u.uniform() * 4.0;
    const int64_t want = x < 2.0 ? 1 : x < 2.5 ? 2 : 4;
    ASSERT_EQ(sample_from(p, r), want) << "draw " << i << " u*total " << x;
  }
}

TEST(SamplingSampleFrom, FrequenciesMatchPByChiSquare) {
  const std::vector<double> p = {0.05, 0.0, 0.3, 0.15, 0.2, 0.0, 0.1, 0.2};
  constexpr int64_t kDraws = 200000;
  const uint64_t seed = test::seed_for("sample_from/chi_square");
  std::printf("[dsv41] sample_from seed %llu\n", static_cast<unsigned long long>(seed));
  SampleRng r(seed);
  std::vector<int64_t> counts(p.size(), 0);
  for (int64_t i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(sample_from(p, r))];
  double chi2 = 0;
  int categories = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has no mass";
      continue;
    }
    const double e = static_cast<double>(kDraws) * p[i];
    chi2 += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++categories;
  }
  ASSERT_GT(*std::max_element(counts.begin(), counts.end()), 0);
  const boost::math::chi_squared law(categories - 1);
  const double critical = boost::math::quantile(boost::math::complement(law, 1e-6));
  std::printf("[dsv41] sample_from: chi2 %.3f, df %d, critical (alpha 1e-6) %.3f\n", chi2, categories - 1, critical);
  EXPECT_LT(chi2, critical);
}

TEST(SamplingSampleFrom, RefusesNegativeNonFiniteOrEmptyMass) {
  SampleRng r(1);
  EXPECT_THAT(error_of([&] { sample_from({0.5, -0.1, 0.6}, r); }), HasSubstr("negative"));
  EXPECT_THAT(error_of([&] { sample_from({0.5, std::nan(""), 0.6}, r); }), HasSubstr("not finite"));
  EXPECT_THAT(error_of([&] { sample_from({0.5, HUGE_VAL}, r); }), HasSubstr("not finite"));
  EXPECT_THAT(error_of([&] { sample_from({0.0, 0.0}, r); }), HasSubstr("no mass"));
}

}  // namespace
}  // namespace dsv41::reference
