// index_scores' integer path (reference/ops/indexer_fast.cc) against its double path (indexer.cc's
// scores16, the readable specification), bit for bit: FP4-QDQ inputs of several shapes (heads
// 1..64, Di 32/64/128 and odd ones, key counts off the groups of 16, reaches cutting rows, the pool
// variant), edge inputs (zeros, -0, scale spans too wide to encode, exponents at the fp32 limits,
// overflowing dots, weights 0 / subnormal / huge, inf and NaN), every kernel this CPU runs, and
// 1 to 3 threads. The tallies show which path each group took, so a test cannot pass by never
// taking the integer path. The oracle runs of indexer_test score through the integer path too.
//
// rapidcheck prints its seed when a property fails; replay with
//   RC_PARAMS="seed=<n>" ./index_scores_integer_test --gtest_filter='IndexScoresIntegerProperty.*'
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/indexer.h"
#include "reference/ops/indexer_fast.h"
#include "reference/ops/numerics.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kE2m1[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// One FP4-QDQ row [d]: E2M1 values times one power-of-two scale per 32 channels, the scales'
// exponents in [base, base + span].
void fp4_row(std::mt19937_64& rng, float* x, int64_t d, int base, int span) {
  for (int64_t b = 0; b < d; b += 32) {
    const int e = base + static_cast<int>(rng() % static_cast<uint64_t>(span + 1));
    for (int64_t i = b; i < std::min<int64_t>(d, b + 32); ++i) {
      x[i] = std::ldexp(kE2m1[rng() % 8], e) * ((rng() & 1) != 0 ? -1.0f : 1.0f);
    }
  }
}

float bf16_weight(std::mt19937_64& rng) {
  return formats::round_to_bf16(std::ldexp(static_cast<float>(1 + rng() % 255), static_cast<int>(rng() % 6) - 12) *
                                ((rng() % 4) == 0 ? -1.0f : 1.0f));
}

uint32_t bits_of(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, 4);
  return b;
}

struct Inputs {
  Tensor<float> q, keys, w;  // [T, Hi, Di], [N, Di], [T, Hi]
  std::vector<int64_t> reach;
  Tensor<uint8_t> pool;  // [T, N], or rank 0: no pool
};

// Scores of one path (the pool variant when in.pool has rank 2).
Tensor<float> scores_by(const Inputs& in, IndexScoresPath path, IndexScoresTally* tally) {
  return in.pool.rank() == 2 ? index_scores_in_pool(in.q, in.keys, in.w, in.reach, in.pool, path, tally)
                             : index_scores(in.q, in.keys, in.w, in.reach, path, tally);
}

// Whether every kernel at 1 and 3 threads gives the double path's bits; the integer path's tally
// (of the best kernel at 1 thread) goes to *tally. Reports the first difference.
::testing::AssertionResult integer_path_matches(const Inputs& in, IndexScoresTally* tally) {
  IndexScoresTally double_tally;
  set_reference_threads(1);
  const Tensor<float> want = scores_by(in, IndexScoresPath::kDouble, &double_tally);
  if (double_tally.integer_groups != 0) return ::testing::AssertionFailure() << "kDouble took the integer path";
  std::vector<std::string> kernels = indexer_detail::integer_path_kernels();
  kernels.insert(kernels.begin(), "");  // the default choice first: its tally is reported
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (const std::string& kernel : kernels) {
    for (int threads : {1, 3}) {
      indexer_detail::set_integer_path_kernel(kernel);
      set_reference_threads(threads);
      IndexScoresTally t;
      const Tensor<float> got = scores_by(in, IndexScoresPath::kInteger, &t);
      if (kernel.empty() && threads == 1 && tally != nullptr) *tally = t;
      if (t.integer_groups + t.double_groups != double_tally.double_groups) {
        result = ::testing::AssertionFailure() << "kernel '" << kernel << "': " << t.integer_groups << " + "
                                               << t.double_groups << " groups, the double path scored "
                                               << double_tally.double_groups;
      }
      for (int64_t i = 0; i < want.numel() && result; ++i) {
        const float a = got.data()[static_cast<size_t>(i)], b = want.data()[static_cast<size_t>(i)];
        if (bits_of(a) != bits_of(b)) {
          char bits[64];
          std::snprintf(bits, sizeof bits, "0x%08x vs 0x%08x", bits_of(a), bits_of(b));
          result = ::testing::AssertionFailure() << "kernel '" << (kernel.empty() ? "best" : kernel) << "', "
                                                 << threads << " threads: score " << i / want.dim(1) << ", "
                                                 << i % want.dim(1) << " is " << a << ", the double path " << b
                                                 << " (bits " << bits << ")";
        }
      }
    }
  }
  indexer_detail::set_integer_path_kernel("");
  set_reference_threads(0);
  return result;
}

// The number of finite nonzero scores.
int64_t finite_nonzero(const Tensor<float>& s) {
  return std::count_if(s.data().begin(), s.data().end(), [](float v) { return std::isfinite(v) && v != 0.0f; });
}

Inputs fp4_inputs(std::mt19937_64& rng, int64_t t_count, int64_t heads, int64_t d, int64_t n, int span) {
  Inputs in{Tensor<float>({t_count, heads, d}, "q"), Tensor<float>({n, d}, "keys"), Tensor<float>({t_count, heads}, "w"),
            {}, Tensor<uint8_t>()};
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      fp4_row(rng, in.q.row(t, h), d, static_cast<int>(rng() % 12) - 8, span);
      in.w.at(t, h) = bf16_weight(rng);
    }
    // reaches that cut the groups of 16, growing with t up to n
    in.reach.push_back(std::max<int64_t>(0, (t + 1) * n / t_count - static_cast<int64_t>(rng() % 3)));
  }
  for (int64_t j = 0; j < n; ++j) fp4_row(rng, in.keys.row(j), d, static_cast<int>(rng() % 12) - 8, span);
  return in;
}

TEST(IndexScoresInteger, Fp4QdqShapesMatchTheDoublePath) {
  std::mt19937_64 rng(test::seed_for("index_scores_integer/fp4_shapes"));
  struct Shape {
    int64_t t, heads, d, n;
  };
  for (const Shape s : {Shape{5, 1, 32, 37}, Shape{9, 3, 64, 100}, Shape{17, 4, 32, 161}, Shape{8, 8, 128, 50},
                        Shape{6, 9, 40, 33}, Shape{3, 13, 33, 17}, Shape{4, 64, 128, 70}, Shape{2, 12, 96, 15}}) {
    SCOPED_TRACE("T " + std::to_string(s.t) + " Hi " + std::to_string(s.heads) + " Di " + std::to_string(s.d) +
                 " N " + std::to_string(s.n));
    const Inputs in = fp4_inputs(rng, s.t, s.heads, s.d, s.n, 7);  // scales within x128: all encoded
    IndexScoresTally tally;
    ASSERT_TRUE(integer_path_matches(in, &tally));
    EXPECT_GT(tally.integer_groups, 0);
    EXPECT_EQ(tally.double_groups, 0);
    EXPECT_GT(finite_nonzero(index_scores(in.q, in.keys, in.w, in.reach)), s.n / 2);
  }
}

TEST(IndexScoresInteger, ThePoolVariantMatchesTheDoublePath) {
  std::mt19937_64 rng(test::seed_for("index_scores_integer/pool"));
  Inputs in = fp4_inputs(rng, 12, 8, 64, 200, 3);
  in.pool = Tensor<uint8_t>({12, 200}, "pool", 0);
  for (int64_t t = 0; t < 12; ++t) {
    for (int64_t j = 0; j < 200; ++j) in.pool.at(t, j) = (j / 16) % 3 == 1 ? 0 : static_cast<uint8_t>(rng() % 2);
  }
  IndexScoresTally tally;
  ASSERT_TRUE(integer_path_matches(in, &tally));
  EXPECT_GT(tally.integer_groups, 0);
  const Tensor<float> s = scores_by(in, IndexScoresPath::kInteger, nullptr);
  EXPECT_GT(finite_nonzero(s), 200);
  EXPECT_EQ(s.at(11, 16), -kInf);  // a group outside the pool
}

TEST(IndexScoresInteger, RowsTooWideToEncodeTakeTheDoublePath) {
  std::mt19937_64 rng(test::seed_for("index_scores_integer/wide"));
  Inputs in = fp4_inputs(rng, 6, 4, 128, 64, 7);
  // key 5: scales x256 apart (code 12 x 256 > 2047); query 2, head 3: x2^12; key 40: a bf16 row
  // of 2^60 + 1 - 2^60 (the double path loses the 1: not exact, so it must not be encoded).
  for (int64_t i = 0; i < 128; ++i) in.keys.at(5, i) = std::ldexp(6.0f, i < 32 ? 0 : 8);
  in.q.at(2, 3, 0) = std::ldexp(6.0f, 12);
  in.q.at(2, 3, 1) = 0.5f;
  std::fill(in.keys.row(40), in.keys.row(40) + 128, 0.0f);
  in.keys.at(40, 0) = std::ldexp(1.0f, 60);
  in.keys.at(40, 1) = 1.0f;
  in.keys.at(40, 4) = -std::ldexp(1.0f, 60);
  IndexScoresTally tally;
  ASSERT_TRUE(integer_path_matches(in, &tally));
  EXPECT_GT(tally.integer_groups, 0);
  EXPECT_GT(tally.double_groups, 0);
  EXPECT_GT(finite_nonzero(scores_by(in, IndexScoresPath::kInteger, nullptr)), 64);
}

TEST(IndexScoresInteger, EdgeValuesMatchTheDoublePath) {
  std::mt19937_64 rng(test::seed_for("index_scores_integer/edges"));
  const int64_t t_count = 8, heads = 3, d = 32, n = 48;
  Inputs in = fp4_inputs(rng, t_count, heads, d, n, 2);
  std::fill(in.keys.row(0), in.keys.row(1), 0.0f);    // key 0: +0
  std::fill(in.keys.row(1), in.keys.row(2), -0.0f);   // key 1: -0
  std::fill(in.q.row(1, 0), in.q.row(1, 1), -0.0f);   // query 1 head 0: -0
  for (int64_t i = 0; i < d; ++i) {
    in.keys.at(2, i) = std::ldexp(static_cast<float>(1 + i % 5), -149);  // subnormals, e = -149
    in.keys.at(3, i) = std::ldexp(1.5f, 126 - i % 3);                   // near the top, e = 123
    in.keys.at(4, i) = std::ldexp(static_cast<float>(i % 7) - 3.0f, -130);  // subnormal +-, 0
    in.q.at(2, 1, i) = std::ldexp(1.5f, 100 + i % 2);  // times key 3: the fp32 dot overflows to inf
    in.q.at(3, 2, i) = std::ldexp(static_cast<float>(1 + i % 3), 20);  // times key 2: tiny dots
  }
  in.keys.at(20, 7) = kInf;                                            // not finite: not encoded
  in.keys.at(21, 0) = std::numeric_limits<float>::quiet_NaN();
  in.q.at(4, 0, 5) = -kInf;                                            // query 4 not encoded
  in.w.at(2, 1) = 0.0f;                                                // inf dot times 0: NaN
  in.w.at(3, 2) = formats::round_to_bf16(std::ldexp(1.0f, -130));     // a subnormal bf16 weight
  in.w.at(5, 0) = std::ldexp(1.0f, 127);                               // huge weight: terms overflow
  in.w.at(6, 1) = -std::ldexp(1.0f, 100);
  in.w.at(7, 0) = -0.0f;
  for (int64_t t = 0; t < t_count; ++t) in.reach[static_cast<size_t>(t)] = n - (t % 3) * 5;
  IndexScoresTally tally;
  ASSERT_TRUE(integer_path_matches(in, &tally));
  EXPECT_GT(tally.integer_groups, 0);
  EXPECT_GT(tally.double_groups, 0);
  const Tensor<float> s = scores_by(in, IndexScoresPath::kInteger, nullptr);
  EXPECT_GT(finite_nonzero(s), n);
  EXPECT_TRUE(std::isnan(s.at(2, 3)));  // the inf x 0 term (relu(inf) * 0)
  EXPECT_EQ(s.at(5, 45), -kInf);        // past the reach
}

// The code bound, one key at a time against an all-ones query: |code| 2047 is encoded, 2049 and
// 4096 are not (nor 3 x 2^14, which would not fit int16), and the scores still agree.
TEST(IndexScoresInteger, TheCodeBoundIs2047) {
  struct Case {
    float big;
    bool encoded;
  };
  for (const Case c : {Case{2047.0f, true}, Case{-2047.0f, true}, Case{1024.0f, true}, Case{2049.0f, false},
                       Case{4096.0f, false}, Case{3.0f * 16384.0f, false}, Case{-255.0f * 32768.0f, false}}) {
    SCOPED_TRACE("the key's large value " + std::to_string(c.big));
    Inputs in{Tensor<float>({1, 2, 32}, "q", 1.0f), Tensor<float>({1, 32}, "keys", 0.0f),
              Tensor<float>({1, 2}, "w", 0.5f), {1}, Tensor<uint8_t>()};
    in.keys.at(0, 0) = c.big;
    in.keys.at(0, 9) = 1.0f;                 // the lowest set bit 2^0
    in.keys.at(0, 30) = -6.0f;
    in.q.at(0, 1, 0) = -1.0f;
    IndexScoresTally tally;
    ASSERT_TRUE(integer_path_matches(in, &tally));
    EXPECT_EQ(tally.integer_groups, c.encoded ? 1 : 0);
    EXPECT_EQ(tally.double_groups, c.encoded ? 0 : 1);
    EXPECT_NE(scores_by(in, IndexScoresPath::kInteger, nullptr).at(0, 0), 0.0f);
  }
}

// An empty call, a query that reaches nothing, and Di past the integer path's 512 (all double).
TEST(IndexScoresInteger, EmptyAndUnencodableShapes) {
  std::mt19937_64 rng(test::seed_for("index_scores_integer/empty"));
  Inputs in = fp4_inputs(rng, 3, 2, 32, 20, 1);
  in.reach = {0, 0, 20};
  IndexScoresTally tally;
  ASSERT_TRUE(integer_path_matches(in, &tally));
  EXPECT_EQ(tally.integer_groups, 2);
  Inputs wide = fp4_inputs(rng, 2, 2, 544, 18, 1);
  ASSERT_TRUE(integer_path_matches(wide, &tally));
  EXPECT_EQ(tally.integer_groups, 0);
  EXPECT_FALSE(indexer_detail::integer_path_fits(544));
  EXPECT_TRUE(indexer_detail::integer_path_fits(512));
  EXPECT_THROW(indexer_detail::set_integer_path_kernel("sse9"), Error);
}

// Random shapes and rows: FP4-QDQ of any scale span (some encoded, some not), arbitrary bf16 rows,
// exponents anywhere in fp32, random weights, reaches and pools.
RC_GTEST_PROP(IndexScoresIntegerProperty, IntegerPathHasTheDoublePathsBits, ()) {
  const int64_t t_count = *rc::gen::inRange(1, 7), heads = *rc::gen::inRange(1, 20);
  const int64_t d = *rc::gen::elementOf(std::vector<int64_t>{1, 2, 31, 32, 64, 65, 128});
  const int64_t n = *rc::gen::inRange(1, 70);
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  const int span = *rc::gen::inRange(0, 10), base = *rc::gen::inRange(-140, 110);
  const int kind = *rc::gen::inRange(0, 3);  // 0: FP4-QDQ, 1: bf16 rows near one scale, 2: a mix
  Inputs in = fp4_inputs(rng, t_count, heads, d, n, span);
  const auto row = [&](float* x) {
    if (kind == 0 || (kind == 2 && rng() % 2 == 0)) {
      fp4_row(rng, x, d, base, span);
    } else {
      for (int64_t i = 0; i < d; ++i) {
        x[i] = formats::round_to_bf16(std::ldexp(static_cast<float>(static_cast<int>(rng() % 511) - 255),
                                                 base + static_cast<int>(rng() % static_cast<uint64_t>(span + 1))));
      }
    }
  };
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t h = 0; h < heads; ++h) row(in.q.row(t, h));
  }
  for (int64_t j = 0; j < n; ++j) row(in.keys.row(j));
  for (int64_t t = 0; t < t_count; ++t) in.reach[static_cast<size_t>(t)] = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
  if (*rc::gen::arbitrary<bool>()) {
    in.pool = Tensor<uint8_t>({t_count, n}, "pool", 0);
    for (uint8_t& m : in.pool.data()) m = static_cast<uint8_t>(rng() % 3 != 0);
  }
  IndexScoresTally tally;
  const ::testing::AssertionResult same = integer_path_matches(in, &tally);
  if (!same) RC_FAIL(same.message());
  RC_TAG(tally.integer_groups > 0 ? "integer groups" : "double only");
}

}  // namespace
}  // namespace dsv41::reference
