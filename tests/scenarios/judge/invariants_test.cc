// tests/scenarios/judge/invariants_test.cc: the mHC comb's column-sum invariant
// (scenarios/judge/invariants.h) holds for correct Sinkhorns in any order and is broken by small bugs.
#include "scenarios/judge/invariants.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "reference/ops/mhc.h"

namespace dsv41::scenarios::judge {
namespace {

constexpr int kHc = 4, kIters = 20, kTokens = 64;
constexpr double kEps = 1e-6;

// [kTokens, hc*hc] comb logits in [-lo, lo] (seeded; the seed printed).
std::vector<float> logits(uint32_t seed, float lo) {
  std::printf("comb logits seed %u\n", seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-lo, lo);
  std::vector<float> v(static_cast<size_t>(kTokens * kHc * kHc));
  for (float& x : v) x = u(rng);
  return v;
}

// The reference's Sinkhorn (reference/ops/mhc.h hc_sinkhorn_row) of exp(logits), token by token.
std::vector<float> reference_comb(std::vector<float> l) {
  for (float& x : l) x = std::exp(x);
  for (int t = 0; t < kTokens; ++t) reference::hc_sinkhorn_row(l.data() + t * kHc * kHc, kHc, kIters, kEps);
  return l;
}

// Another correct order: every sum right to left, divisions as multiplications by the reciprocal
// (two roundings), the first step like the later ones. extra_row_step: a bug, a Sinkhorn that ends
// on a row normalisation.
std::vector<float> other_order_comb(std::vector<float> l, int iters, bool extra_row_step) {
  const float e = static_cast<float>(kEps);
  for (float& x : l) x = std::exp(x);
  const auto rows = [&](float* c) {
    for (int i = 0; i < kHc; ++i) {
      float s = e;
      for (int j = kHc - 1; j >= 0; --j) s += c[i * kHc + j];
      const float r = 1.0f / s;
      for (int j = 0; j < kHc; ++j) c[i * kHc + j] *= r;
    }
  };
  const auto cols = [&](float* c) {
    for (int j = 0; j < kHc; ++j) {
      float s = 0.0f;
      for (int i = kHc - 1; i >= 0; --i) s += c[i * kHc + j];
      const float r = 1.0f / (s + e);
      for (int i = 0; i < kHc; ++i) c[i * kHc + j] *= r;
    }
  };
  for (int t = 0; t < kTokens; ++t) {
    float* c = l.data() + t * kHc * kHc;
    for (int it = 0; it < iters; ++it) {
      rows(c);
      cols(c);
    }
    if (extra_row_step) rows(c);
  }
  return l;
}

void expect_meaningful(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += std::fabs(x);
  }
  ASSERT_GT(sum, 0.0);
}

TEST(CombColsum, CorrectOrdersAndNoisyInputsStayWithinTheBound) {
  const double bound = comb_colsum_tolerance(kHc, kEps).bound;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<float> l = logits(seed, 2.0f);
    const std::vector<float> ref = reference_comb(l);
    expect_meaningful(ref);
    // The same logits in another order.
    const CombColsum same = comb_colsum(ref, other_order_comb(l, kIters, false), kHc, kEps, "comb");
    EXPECT_GT(same.checked, kTokens * kHc / 2);
    EXPECT_LE(same.max_dev, bound) << describe(same);
    // Logits moved by rounding-level noise (what a port's own mixes give), then another order.
    std::vector<float> noisy = l;
    std::mt19937 rng(seed + 100);
    std::uniform_real_distribution<float> n(-2e-3f, 2e-3f);
    for (float& x : noisy) x += n(rng);
    const CombColsum moved = comb_colsum(ref, other_order_comb(noisy, kIters, false), kHc, kEps, "comb");
    EXPECT_LE(moved.max_dev, bound) << describe(moved);
    // The values themselves moved far more than the bound: the invariant, not the values, is sharp.
    const std::vector<float> port = other_order_comb(noisy, kIters, false);
    double max_elem = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_elem = std::max(max_elem, std::fabs(double(ref[i]) - port[i]));
    EXPECT_GT(max_elem, 10 * bound);
  }
}

TEST(CombColsum, SmallBugsBreakIt) {
  const double bound = comb_colsum_tolerance(kHc, kEps).bound;
  const std::vector<float> l = logits(7, 2.0f);
  const std::vector<float> ref = reference_comb(l);
  expect_meaningful(ref);
  // One token's comb x 1.001 (a mutant row).
  std::vector<float> scaled = ref;
  for (int k = 0; k < kHc * kHc; ++k) scaled[static_cast<size_t>(5 * kHc * kHc + k)] *= 1.001f;
  const CombColsum s = comb_colsum(ref, scaled, kHc, kEps, "comb");
  EXPECT_GT(s.max_dev, 10 * bound) << describe(s);
  EXPECT_EQ(s.worst_token, 5);
  // The comb kept in bf16 (a port that stores the mixes in the activations' dtype).
  std::vector<float> bf = ref;
  for (float& v : bf) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // round to nearest even, to bf16
    std::memcpy(&v, &u, 4);
  }
  const CombColsum r = comb_colsum(ref, bf, kHc, kEps, "comb");
  EXPECT_GT(r.max_dev, 10 * bound) << describe(r);
  // Not broken (documented): a converged comb is doubly stochastic, so its transpose and one more row
  // step keep the column sums; other checks must see those.
  std::vector<float> tr = ref;
  for (int t = 0; t < kTokens; ++t) {
    for (int i = 0; i < kHc; ++i) {
      for (int j = 0; j < kHc; ++j) tr[static_cast<size_t>(t * 16 + i * kHc + j)] = ref[static_cast<size_t>(t * 16 + j * kHc + i)];
    }
  }
  EXPECT_LE(comb_colsum(ref, tr, kHc, kEps, "comb").max_dev, bound);
  EXPECT_LE(comb_colsum(ref, other_order_comb(l, kIters, true), kHc, kEps, "comb").max_dev, bound);
}

TEST(CombColsum, TinyColumnMassesAreSkippedAndBadShapesThrow) {
  std::vector<float> ref(16, 0.0f), port(16, 0.0f);  // every column empty: nothing to check
  const CombColsum c = comb_colsum(ref, port, kHc, kEps, "comb");
  EXPECT_EQ(c.checked, 0);
  EXPECT_EQ(c.skipped, kHc);
  EXPECT_THROW(comb_colsum(ref, std::vector<float>(15), kHc, kEps, "comb"), Error);
  EXPECT_THROW(comb_colsum(std::vector<float>(15), std::vector<float>(15), kHc, kEps, "comb"), Error);
  EXPECT_EQ(comb_colsum_tolerance(kHc, kEps).origin, "analytic");
}

// Directional fits: a synthetic "port" error along one direction plus noise is attributed to that
// direction, not to an overlapping one; pure noise fits nothing.
TEST(FitDirections, JointFitAttributesTheRightDirection) {
  std::printf("fit seed 11\n");
  std::mt19937 rng(11);
  std::normal_distribution<double> g(0.0, 1.0);
  const size_t n = 4096;
  std::vector<float> a(n), h1(n), h2(n), noisy(n), bug(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(g(rng));
    const double d1 = 1e-3 * g(rng), d2 = 0.6 * d1 + 8e-4 * g(rng);  // overlapping directions
    h1[i] = static_cast<float>(a[i] + d1);
    h2[i] = static_cast<float>(a[i] + d2);
    noisy[i] = static_cast<float>(a[i] + 1e-4 * g(rng));
    bug[i] = static_cast<float>(a[i] + (double(h2[i]) - a[i]) + 1e-4 * g(rng));  // "off by one step" of h2
  }
  expect_meaningful(a);
  const std::vector<DirectionalFit> clean = fit_directions(a, noisy, {&h1, &h2}, 64, "noise");
  ASSERT_EQ(clean.size(), 2u);
  EXPECT_EQ(clean[0].lower, 0.0);
  EXPECT_EQ(clean[1].lower, 0.0);
  EXPECT_GT(clean[0].n, 0);
  const std::vector<DirectionalFit> f = fit_directions(a, bug, {&h1, &h2}, 64, "bug");
  EXPECT_NEAR(f[1].beta, 1.0, 0.05);
  EXPECT_GT(f[1].lower, 0.5);
  EXPECT_EQ(f[0].lower, 0.0) << f[0].beta << " +- " << f[0].se;
  // A single fit along h1 alone would blame it (the directions overlap): the joint fit does not.
  const std::vector<DirectionalFit> alone = fit_directions(a, bug, {&h1}, 64, "bug");
  EXPECT_GT(alone[0].lower, 0.1);
  // Collinear directions: the second is dropped (n = 0), the first still fitted.
  const std::vector<DirectionalFit> twice = fit_directions(a, bug, {&h2, &h2}, 64, "twice");
  EXPECT_GT(twice[0].lower, 0.5);
  EXPECT_EQ(twice[1].n, 0);
  EXPECT_THROW(fit_directions(a, bug, {&noisy, nullptr}, 64, "bad"), Error);
  std::vector<float> shorter(n - 1);
  EXPECT_THROW(fit_directions(a, bug, {&shorter}, 64, "bad"), Error);
  EXPECT_THROW(fit_directions(a, bug, {&h1}, 100, "bad"), Error);  // 4096 values are not rows of 100
  // Too few rows to estimate the spread between them: not fitted.
  EXPECT_EQ(fit_directions(a, bug, {&h2}, 1024, "4 rows")[0].n, 0);
}

// Errors correlated within a row (one random multiple of the row's direction: what a few internal
// roundings mixed into every value of a token do) and a gain error along a itself: no hypothesis
// fits, where an independent-errors standard error would have blamed the direction.
TEST(FitDirections, RowCorrelatedNoiseAndGainsAreNotHypotheses) {
  std::printf("fit seed 12\n");
  std::mt19937 rng(12);
  std::normal_distribution<double> g(0.0, 1.0);
  const size_t rows = 32, row = 128, n = rows * row;
  std::vector<float> a(n), h(n), port(n), gained(n);
  for (size_t r = 0; r < rows; ++r) {
    const double c = 0.3 * g(rng);  // this row's share of the direction: noise across rows
    for (size_t j = 0; j < row; ++j) {
      const size_t i = r * row + j;
      a[i] = static_cast<float>(g(rng));
      const double d = 1e-3 * (g(rng) + 0.5 * a[i]);  // overlaps the gain direction
      h[i] = static_cast<float>(a[i] + d);
      port[i] = static_cast<float>(a[i] + c * d + 1e-6 * g(rng));
      gained[i] = static_cast<float>(a[i] * (1 + 2e-3) + 1e-5 * g(rng));
    }
  }
  expect_meaningful(a);
  const DirectionalFit f = fit_directions(a, port, {&h}, row, "row-correlated")[0];
  EXPECT_EQ(f.rows, static_cast<int64_t>(rows));
  EXPECT_EQ(f.lower, 0.0) << f.beta << " +- " << f.se;
  const DirectionalFit gain = fit_directions(a, gained, {&h}, row, "gain")[0];
  EXPECT_EQ(gain.lower, 0.0) << gain.beta << " +- " << gain.se;
}

}  // namespace
}  // namespace dsv41::scenarios::judge
