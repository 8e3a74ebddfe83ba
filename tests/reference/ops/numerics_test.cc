// reference/ops/numerics.h: the fast forms of the pinned reductions give the plain forms' bits, and
// parallel_for's persistent pool keeps its contract (every index once, exceptions re-thrown on the
// caller, nested calls, concurrent callers, any thread count).
//   - dot_f64_f32_x4 == four dot_f64_f32, fma_dot_f32(_x4) == the std::fma chain written out here
//     (this file's std::fma: whatever the build's libm or compiler gives; exact by definition);
//   - dot_exact_f32 == dot_f64_f32 on its promised operands is checked in multiprecision_test.cc.
// Inputs are seeded (tests/support/seed.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/base.h"
#include "base/error.h"
#include "reference/ops/numerics.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

std::vector<float> random_values(std::mt19937_64& rng, int64_t n, bool bf16) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16 ? round_to_bf16(d(rng) * 3.0f) : std::ldexp(d(rng), static_cast<int>(rng() % 9) - 4);
  return v;
}

float plain_fma_chain(const float* a, const float* b, int64_t stride, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i * stride], acc);
  return acc;
}

// Odd lengths on purpose: 1 (one term), 31/33 (around a block), 1023 (an mHC width minus one).
TEST(NumericsDots, SideBySideFormsGiveThePlainBits) {
  std::mt19937_64 rng(test::seed_for("numerics/dots"));
  for (int64_t n : {1, 7, 31, 32, 33, 128, 1023}) {
    for (int trial = 0; trial < 50; ++trial) {
      const std::vector<float> a = random_values(rng, n, true);
      std::vector<std::vector<float>> rows;
      for (int k = 0; k < 4; ++k) rows.push_back(random_values(rng, n, trial % 2 == 0));
      const float* b[4] = {rows[0].data(), rows[1].data(), rows[2].data(), rows[3].data()};
      float x4[4], f4[4];
      dot_f64_f32_x4(a.data(), b, n, x4);
      fma_dot_f32_x4(a.data(), b, 1, n, f4);
      bool nonzero = false;
      for (int k = 0; k < 4; ++k) {
        ASSERT_FALSE(std::isnan(x4[k]) || std::isnan(f4[k]));
        nonzero = nonzero || x4[k] != 0.0f;
        EXPECT_EQ(f32_bits(x4[k]), f32_bits(dot_f64_f32(a.data(), b[k], n))) << "n " << n << " row " << k;
        EXPECT_EQ(f32_bits(f4[k]), f32_bits(plain_fma_chain(a.data(), b[k], 1, n))) << "n " << n << " row " << k;
        EXPECT_EQ(f32_bits(fma_dot_f32(a.data(), b[k], 1, n)), f32_bits(f4[k])) << "n " << n << " row " << k;
      }
      EXPECT_TRUE(nonzero);
    }
  }
}

TEST(NumericsDots, StridedFmaChainsReadTheColumn) {
  std::mt19937_64 rng(test::seed_for("numerics/strided"));
  const int64_t rows = 63, cols = 129;  // a [rows, cols] block read column by column (sparse_attn's P.V)
  const std::vector<float> m = random_values(rng, rows * cols, true), p = random_values(rng, rows, true);
  for (int64_t c = 0; c + 4 <= cols; c += 4) {
    const float* col[4] = {m.data() + c, m.data() + c + 1, m.data() + c + 2, m.data() + c + 3};
    float out[4];
    fma_dot_f32_x4(p.data(), col, cols, rows, out);
    for (int k = 0; k < 4; ++k) {
      ASSERT_EQ(f32_bits(out[k]), f32_bits(plain_fma_chain(p.data(), m.data() + c + k, cols, rows))) << c + k;
    }
  }
}

class NumericsPool : public ::testing::Test {
 protected:
  void TearDown() override { set_reference_threads(0); }
};

TEST_F(NumericsPool, EveryIndexRunsOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    set_reference_threads(threads);
    for (int64_t n : {0, 1, 2, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " threads, i " << i;
    }
  }
}

TEST_F(NumericsPool, AnExceptionReachesTheCallerAndThePoolGoesOn) {
  set_reference_threads(3);
  EXPECT_THROW(parallel_for(100, [](int64_t i) {
                 if (i == 77) DSV41_FAIL("index ", i, " failed");
               }),
               Error);
  std::atomic<int64_t> sum{0};
  parallel_for(100, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST_F(NumericsPool, NestedAndConcurrentCallsComplete) {
  set_reference_threads(4);
  std::atomic<int64_t> inner{0};
  parallel_for(8, [&](int64_t) { parallel_for(10, [&](int64_t) { ++inner; }); });
  EXPECT_EQ(inner.load(), 80);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) parallel_for(50, [&](int64_t) { ++total; });
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 20 * 50);
}

}  // namespace
}  // namespace dsv41::reference
