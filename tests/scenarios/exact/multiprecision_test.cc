// The reference's arithmetic against exact values computed with Boost.Multiprecision
// (cpp_bin_float, 256 binary digits: every sum below is exact in it, and its + - * / sqrt are
// correctly rounded). docs/numerics.md derives each bound asserted here:
//   (a) dot_f64_f32 of one 32-wide fp8 x fp8 or fp4 x fp8 block IS the exactly rounded value,
//       and so is dot_exact_f32 (any summation order);
//   (b) dot_f64_f32 of long (n = 4096) bf16 and fp32 dot products is within
//       n * 2^-53 * sum|a_i b_i| + half an fp32 ulp of the exact value;
//   (c) RMSNorm's statistic and outputs, and a softmax (fp32 exp terms, fp32 sum in a fixed
//       order, division), are within their documented bounds of the exact values.
// Inputs are seeded (tests/support/seed.h); the observed error / bound ratios are printed.
#include <gtest/gtest.h>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "base/base.h"
#include "formats/minifloat.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

namespace mp = boost::multiprecision;
using Exact = mp::number<mp::cpp_bin_float<256, mp::digit_base_2>, mp::et_off>;

const double kU32 = std::ldexp(1.0, -24);  // unit roundoff of fp32
const double kU64 = std::ldexp(1.0, -53);  // unit roundoff of double

Exact exact(float v) { return Exact(static_cast<double>(v)); }

// gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability, Lemma 3.1).
double gamma(int64_t k, double u) { return double(k) * u / (1.0 - double(k) * u); }

// Half the spacing of fp32 values just above |r|: bounds |r - v| for any v that rounds to r.
Exact half_ulp_f32(float r) {
  const float a = std::fabs(r);
  return (exact(std::nextafter(a, INFINITY)) - exact(a)) / 2;
}

// True if r is s rounded to nearest fp32, ties to even (checked from the definition: no fp32
// neighbour of r is closer to s, and at a tie r has an even significand).
bool is_round_to_nearest_even(const Exact& s, float r) {
  if (!std::isfinite(r)) return false;
  const Exact d = mp::abs(s - exact(r));
  const Exact dlo = mp::abs(s - exact(std::nextafter(r, -INFINITY)));
  const Exact dhi = mp::abs(s - exact(std::nextafter(r, INFINITY)));
  if (d > dlo || d > dhi) return false;
  if (d == dlo || d == dhi) return (dsv41::f32_bits(r) & 1u) == 0;
  return true;
}

// ---- (a) quantized 32-blocks are exact ----

// A random finite E4M3 value (codes 0x00..0x7E with a random sign; no NaN).
float random_e4m3(std::mt19937_64& rng) {
  const uint32_t mag = std::uniform_int_distribution<uint32_t>(0, 0x7E)(rng);
  return formats::e4m3_decode(mag | (rng() & 1u ? 0x80u : 0u));
}

TEST(MultiprecisionDot, QuantizedBlocksAreExactlyRounded) {
  std::mt19937_64 rng(test::seed_for("multiprecision/blocks/n=32"));
  constexpr int64_t kTrials = 20000;
  int64_t inexact = 0, nonzero = 0;
  for (int64_t trial = 0; trial < kTrials; ++trial) {
    float a[32], b[32];
    const int kind = static_cast<int>(trial % 4);
    for (int i = 0; i < 32; ++i) {
      switch (kind) {
        case 0:  // fp8 x fp8, uniform over codes
          a[i] = random_e4m3(rng);
          b[i] = random_e4m3(rng);
          break;
        case 1:  // fp4 weight x fp8 activation
          a[i] = random_e4m3(rng);
          b[i] = formats::e2m1_decode(static_cast<uint32_t>(rng() & 15u));
          break;
        case 2:  // widest exponent span: +-448^2 next to +-2^-18 (the smallest subnormal products)
          a[i] = (i % 2 ? 448.0f : std::ldexp(1.0f, -9)) * (rng() & 1u ? -1.0f : 1.0f);
          b[i] = i % 2 ? 448.0f : std::ldexp(1.0f, -9);
          break;
        default:  // heavy cancellation: pairs that cancel, plus one small survivor
          a[i] = random_e4m3(rng);
          b[i] = random_e4m3(rng);
          if (i % 2 == 1) {
            a[i] = -a[i - 1];
            b[i] = b[i - 1];
          }
          if (i == 31) a[i] = std::ldexp(1.0f, -9);
          break;
      }
    }
    Exact s = 0;
    for (int i = 0; i < 32; ++i) s += exact(a[i]) * exact(b[i]);
    const float r = dot_f64_f32(a, b, 32);
    ASSERT_FALSE(std::isnan(r));
    // The order-free form the fp8/fp4 linears use gives the same, exact, value.
    ASSERT_EQ(f32_bits(dot_exact_f32(a, b, 32)), f32_bits(r)) << "trial " << trial << " kind " << kind;
    nonzero += r != 0.0f;
    inexact += s != exact(r);
    ASSERT_TRUE(is_round_to_nearest_even(s, r))
        << "trial " << trial << " kind " << kind << ": dot " << r << " is not the rounded exact sum";
  }
  std::printf("[multiprecision] (a) %lld blocks: all exactly rounded (%lld needed rounding to fp32)\n",
              static_cast<long long>(kTrials), static_cast<long long>(inexact));
  EXPECT_GT(nonzero, kTrials * 9 / 10);
  EXPECT_GT(inexact, 0) << "the test never exercised the final rounding";
}

// ---- (b) long dot products ----

struct Worst {
  double ratio = 0.0;  // max observed |error| / bound
  void add(const Exact& err, const Exact& bound) {
    ratio = std::max(ratio, static_cast<double>(err / bound));
  }
};

TEST(MultiprecisionDot, LongDotsAreWithinTheDoubleAccumulationBound) {
  constexpr int64_t n = 4096;
  std::mt19937_64 rng(test::seed_for("multiprecision/long-dot/n=4096"));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-20.0f, 20.0f);
  Worst worst, worst_fp32_sequential;
  int64_t dots = 0;
  double worst_ulps = 0.0;  // |error| in fp32 ulps of the result
  for (int trial = 0; trial < 24; ++trial) {
    const bool bf16 = trial % 2 == 0;
    const int shape = (trial / 2) % 3;  // 0 normal, 1 log-uniform 2^-20..2^20, 2 cancelling halves
    std::vector<float> a(n), b(n);
    for (int64_t i = 0; i < n; ++i) {
      float x = normal(rng), y = normal(rng);
      if (shape == 1) {
        x = std::ldexp(x, static_cast<int>(expo(rng)));
        y = std::ldexp(y, static_cast<int>(expo(rng)));
      }
      if (shape == 2 && i >= n / 2) {
        x = -a[static_cast<size_t>(i - n / 2)] * (1.0f + normal(rng) * 1e-3f);
        y = b[static_cast<size_t>(i - n / 2)];
      }
      a[static_cast<size_t>(i)] = bf16 ? formats::round_to_bf16(x) : x;
      b[static_cast<size_t>(i)] = bf16 ? formats::round_to_bf16(y) : y;
    }
    Exact s = 0, abs_sum = 0;
    float seq = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const Exact p = exact(a[i]) * exact(b[i]);
      s += p;
      abs_sum += mp::abs(p);
      seq += a[i] * b[i];
    }
    const float r = dot_f64_f32(a.data(), b.data(), n);
    ASSERT_FALSE(std::isnan(r));
    ASSERT_GT(abs_sum, 0);
    // |acc - s| <= gamma_{n-1}(2^-53) sum|a_i b_i| <= n 2^-53 sum|a_i b_i| (products exact in
    // double: 24 + 24 <= 53 bits); then fl32(acc) adds at most half an fp32 ulp.
    const Exact bound = Exact(double(n) * kU64) * abs_sum + half_ulp_f32(r);
    const Exact err = mp::abs(exact(r) - s);
    ASSERT_LE(err, bound) << "trial " << trial << (bf16 ? " bf16" : " fp32") << " shape " << shape;
    worst.add(err, bound);
    worst_ulps = std::max(worst_ulps, static_cast<double>(err / (2 * half_ulp_f32(r))));
    // For contrast: a sequential fp32 sum against its own bound gamma_n(2^-24) sum|a_i b_i|.
    worst_fp32_sequential.add(mp::abs(exact(seq) - s), Exact(gamma(n, kU32)) * abs_sum + half_ulp_f32(seq));
    ++dots;
  }
  std::printf("[multiprecision] (b) %lld dots of n=%lld: max |err|/bound = %.3g, max |err| = %.3g fp32 ulp "
              "(fp32 sequential sum vs its bound: %.3g)\n",
              static_cast<long long>(dots), static_cast<long long>(n), worst.ratio, worst_ulps,
              worst_fp32_sequential.ratio);
}

// ---- (c) RMSNorm and softmax ----

TEST(MultiprecisionNorm, RmsNormIsWithinItsBound) {
  std::mt19937_64 rng(test::seed_for("multiprecision/rmsnorm"));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale_exp(-12, 12);
  const double eps = 1e-20;
  double worst_r = 0.0, worst_y = 0.0;
  for (int64_t n : {64, 256, 4096, 7168}) {  // 7168: the released model's dim
    for (int trial = 0; trial < 6; ++trial) {
      const int e = scale_exp(rng);
      std::vector<float> x(static_cast<size_t>(n)), w(x.size()), y(x.size());
      for (float& v : x) v = formats::round_to_bf16(std::ldexp(normal(rng), e));
      for (float& v : w) v = formats::round_to_bf16(1.0f + 0.1f * normal(rng));
      const float r = rms_rsqrt_f32(x.data(), n, eps);
      rms_norm_row(x.data(), w.data(), n, eps, y.data());
      // Exact statistic: bf16 squares are exact in fp32, so only the sum, / n, + eps, sqrt and
      // 1/ round. v^ = V (1 + t), |t| <= gamma_{n+1}; r^ / R = (1 + d') / ((1 + d) sqrt(1 + t)).
      Exact sq = 0;
      for (float v : x) sq += exact(v) * exact(v);
      const Exact R = 1 / mp::sqrt(sq / n + Exact(static_cast<double>(static_cast<float>(eps))));
      const double g = gamma(n + 1, kU32);
      const double bound_r = std::max((1 + kU32) / ((1 - kU32) * std::sqrt(1 - g)) - 1,
                                      1 - (1 - kU32) / ((1 + kU32) * std::sqrt(1 + g)));
      const double rel_r = static_cast<double>(mp::abs(exact(r) / R - 1));
      ASSERT_LE(rel_r, bound_r) << "n=" << n << " trial " << trial;
      worst_r = std::max(worst_r, rel_r / bound_r);
      // Outputs: z = fl(w fl(x r^)) has relative error <= (1 + bound_r)(1 + u)^2 - 1 against
      // Y = w x R, then bf16 rounding adds half a bf16 ulp of |y|.
      const double bound_z = (1 + bound_r) * (1 + kU32) * (1 + kU32) - 1;
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_FALSE(std::isnan(y[i]));
        nonzero += y[i] != 0.0f;
        const Exact Y = exact(w[i]) * exact(x[i]) * R;
        const float ay = std::fabs(y[i]);
        const float next_bf16 = formats::bf16_decode(static_cast<uint32_t>(formats::bf16_encode(ay)) + 1u);
        const Exact half_bf16_ulp = (exact(next_bf16) - exact(ay)) / 2;
        const Exact bound = Exact(bound_z) * mp::abs(Y) + half_bf16_ulp;
        const Exact err = mp::abs(exact(y[i]) - Y);
        ASSERT_LE(err, bound) << "n=" << n << " i=" << i;
        worst_y = std::max(worst_y, static_cast<double>(err / bound));
      }
      EXPECT_GT(nonzero, n / 2);
    }
  }
  std::printf("[multiprecision] (c) RMSNorm: max |r^/R - 1| / bound = %.3g, max output |err| / bound = %.3g\n",
              worst_r, worst_y);
}

// The fixed-order fp32 softmax the numerics policy prescribes: m = max (exact), p_i =
// std::exp(x_i - m) in fp32, the denominator summed in `order`, q_i = p_i / sum.
enum class SumOrder { kTorch, kSequential };

TEST(MultiprecisionSoftmax, SumAndProbabilitiesAreWithinTheirBounds) {
  std::mt19937_64 rng(test::seed_for("multiprecision/softmax"));
  std::normal_distribution<float> normal(0.0f, 4.0f);
  double worst_sum[2] = {0, 0}, worst_q = 0.0;
  double worst_exp_ulps = 0.0;
  for (int64_t n : {2, 64, 333, 4096}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<float> x(static_cast<size_t>(n)), p(x.size());
      for (float& v : x) v = normal(rng);
      const float m = *std::max_element(x.begin(), x.end());
      for (int64_t i = 0; i < n; ++i) {
        const float d = x[i] - m;
        p[i] = std::exp(d);
        // libm expf accuracy (glibc documents < 1 ulp): |p - e^d| <= 1 ulp of p.
        const Exact err = mp::abs(exact(p[i]) - mp::exp(exact(d)));
        const double ulps = static_cast<double>(err / (2 * half_ulp_f32(p[i])));
        worst_exp_ulps = std::max(worst_exp_ulps, ulps);
        ASSERT_LE(ulps, 1.0) << "expf(" << d << ")";
      }
      Exact P = 0, E = 0;
      for (int64_t i = 0; i < n; ++i) {
        P += exact(p[i]);
        E += mp::exp(exact(x[i] - m));
      }
      for (SumOrder order : {SumOrder::kTorch, SumOrder::kSequential}) {
        float s = 0.0f;
        if (order == SumOrder::kTorch) {
          s = torch_sum_f32(p.data(), n);
        } else {
          for (float v : p) s += v;
        }
        // Non-negative terms, any order: |s^ - P| <= gamma_{n-1} P.
        const double rel = static_cast<double>(mp::abs(exact(s) - P) / P);
        const double bound = gamma(n - 1, kU32);
        ASSERT_LE(rel, bound) << "n=" << n;
        worst_sum[static_cast<int>(order)] = std::max(worst_sum[static_cast<int>(order)], rel / bound);
        if (order != SumOrder::kTorch) continue;
        // q_i = fl(p_i / s^) against pi_i = e^{d_i} / sum_j e^{d_j} (d_i = fl(x_i - m)):
        // p_i = e^{d_i}(1 + eta), |eta| <= 2u (1 ulp); so q_i / pi_i lies in
        // [(1-2u)(1-u) / ((1+2u)(1+g)), (1+2u)(1+u) / ((1-2u)(1-g))], g = gamma_{n-1}.
        const double g = gamma(n - 1, kU32), e = 2 * kU32;
        const double hi = (1 + e) * (1 + kU32) / ((1 - e) * (1 - g)) - 1;
        const double lo = 1 - (1 - e) * (1 - kU32) / ((1 + e) * (1 + g));
        const double bound_q = std::max(hi, lo);
        for (int64_t i = 0; i < n; ++i) {
          const float q = p[i] / s;
          ASSERT_FALSE(std::isnan(q));
          const Exact pi = mp::exp(exact(x[i] - m)) / E;
          const double rel_q = static_cast<double>(mp::abs(exact(q) / pi - 1));
          ASSERT_LE(rel_q, bound_q) << "n=" << n << " i=" << i;
          worst_q = std::max(worst_q, rel_q / bound_q);
        }
      }
    }
  }
  std::printf("[multiprecision] (c) softmax: expf max %.3f ulp; sum |err|/bound: torch order %.3g, "
              "sequential %.3g; probabilities %.3g\n",
              worst_exp_ulps, worst_sum[0], worst_sum[1], worst_q);
}

}  // namespace
}  // namespace dsv41::reference
