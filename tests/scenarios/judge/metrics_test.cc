// scenarios/judge/metrics: the divergence metrics on hand-built inputs whose answer follows from the
// construction (docs/metrics.md), and on errors. Each expected value is derived in the comment
// next to it from how the inputs were made, never from a run of the code.
//
//   tensors      one flipped bit at a chosen coordinate of a random bf16 / fp32 tensor (first
//                mismatch, coordinate, byte, ULP), -0 vs +0, NaN and Inf masks, shape errors
//   logits       KL of two-element distributions in closed form, flip triage at the bound
//   index sets   permuted / padded / different-width rows, duplicates, the tie band
//   candidates   whole-block masks, partial blocks, recall within B's pool
//   bytes, ints  first mismatching entry and byte
//
// Random data (the flipped-bit tensors) comes from the printed data seed (DSV41_SEED overrides).
// Where rapidcheck is installed the binary also runs properties (DSV41_METRICS_PROPERTIES):
// compare_tensors(x, x) is exact, Jaccard is symmetric, recall(A, A) = 1, and whole-block masks
// have equal block and token recall. rapidcheck prints its seed; RC_PARAMS="seed=<n>" replays.
#include "scenarios/judge/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "tests/support/seed.h"

#if DSV41_METRICS_PROPERTIES
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#endif

namespace dsv41::scenarios::judge {
namespace {

using reference::Tensor;
using test::error_of;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float bf16(uint32_t bits) { return std::bit_cast<float>(bits << 16); }
uint32_t bits32(float x) { return std::bit_cast<uint32_t>(x); }
float from32(uint32_t u) { return std::bit_cast<float>(u); }

Tensor<float> tensor(std::vector<int64_t> shape, std::vector<float> v) {
  return Tensor<float>(std::move(shape), std::move(v), "t");
}
Tensor<int32_t> rows(int64_t t, int64_t k, std::vector<int32_t> v) { return Tensor<int32_t>({t, k}, std::move(v), "i"); }
Tensor<uint8_t> mask(int64_t t, int64_t n, std::vector<uint8_t> v) { return Tensor<uint8_t>({t, n}, std::move(v), "m"); }

// n random finite, nonzero bf16 values with |x| in [2^-27, 2^24) and random sign.
std::vector<float> random_bf16(const std::string& name, int64_t n) {
  std::mt19937_64 rng(test::seed_for(name));
  std::uniform_int_distribution<uint32_t> exp(100, 150), man(0, 127), sign(0, 1);
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(bf16(sign(rng) << 15 | exp(rng) << 7 | man(rng)));
  return v;
}

// ---- tensors ----

// Shape [3, 5, 7] (rank 3: the coordinate of a flat index in every dimension). Coordinate
// (1, 3, 4) is flat 1*35 + 3*7 + 4 = 60.
TEST(CompareTensors, Bf16MantissaLsbFlip) {
  const std::vector<float> x = random_bf16("tensors/bf16/[3,5,7]", 105);
  std::vector<float> y = x;
  y[60] = from32(bits32(x[60]) ^ (1u << 16));  // bf16 bit 0: the mantissa LSB, in byte 0
  ASSERT_NE(bits32(x[60]), bits32(y[60]));
  const TensorMetrics m = compare_tensors(tensor({3, 5, 7}, x), tensor({3, 5, 7}, y), ValueType::kBf16, "h");
  EXPECT_FALSE(m.a_all_zero);
  EXPECT_FALSE(m.b_all_zero);
  EXPECT_GT(m.a_rms, 0);
  EXPECT_EQ(m.count, 105);
  EXPECT_EQ(m.bit_equal, 104);
  EXPECT_DOUBLE_EQ(m.bit_equal_frac, 104.0 / 105.0);
  EXPECT_FALSE(m.exact());
  EXPECT_EQ(m.first_mismatch, 60);
  EXPECT_EQ(m.first_mismatch_coord, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(m.first_mismatch_byte, 0);
  EXPECT_EQ(m.a_at_first, x[60]);
  EXPECT_EQ(m.b_at_first, y[60]);
  EXPECT_EQ(m.max_ulp, 1);  // same sign, magnitudes one apart
  EXPECT_EQ(m.max_abs, std::fabs(static_cast<double>(x[60]) - y[60]));
  EXPECT_EQ(m.max_abs_index, 60);
  double sum_a2 = 0;
  for (float v : x) sum_a2 += static_cast<double>(v) * v;
  const double d = static_cast<double>(x[60]) - y[60];
  EXPECT_DOUBLE_EQ(m.nmse, d * d / sum_a2);
  EXPECT_EQ(m.nan_mismatch + m.inf_mismatch + m.nonfinite_a + m.nonfinite_b, 0);
}

// A higher bf16 bit lands in byte 1; of two mismatches the lower flat index is reported.
TEST(CompareTensors, Bf16FirstMismatchByteAndOrder) {
  const std::vector<float> x = random_bf16("tensors/bf16/[13]", 13);
  std::vector<float> y = x;
  y[11] = from32(bits32(x[11]) ^ (1u << 16));          // later, byte 0
  y[4] = from32(bits32(x[4]) ^ (1u << (16 + 8)));      // bf16 bit 8 (exponent LSB): byte 1
  const TensorMetrics m = compare_tensors(tensor({13}, x), tensor({13}, y), ValueType::kBf16, "h");
  EXPECT_EQ(m.bit_equal, 11);
  EXPECT_EQ(m.first_mismatch, 4);
  EXPECT_EQ(m.first_mismatch_coord, (std::vector<int64_t>{4}));
  EXPECT_EQ(m.first_mismatch_byte, 1);
  EXPECT_EQ(m.max_ulp, 256);  // bit 8 of the magnitude: 2^8 apart
}

// fp32 storage: 4 bytes; bit 17 is in byte 2, the sign bit in byte 3.
TEST(CompareTensors, Fp32Bytes) {
  const std::vector<float> x = {1.5f, -2.25f, 3.0f, 7.0f, -0.125f};
  std::vector<float> y = x;
  y[2] = from32(bits32(x[2]) ^ (1u << 17));
  TensorMetrics m = compare_tensors(tensor({5}, x), tensor({5}, y), ValueType::kFp32, "f");
  EXPECT_EQ(m.first_mismatch, 2);
  EXPECT_EQ(m.first_mismatch_byte, 2);
  EXPECT_EQ(m.max_ulp, 131072);  // 2^17
  y[2] = from32(bits32(x[2]) ^ (1u << 25 | 1u << 2));  // bytes 3 and 0 differ: byte 0 is reported
  m = compare_tensors(tensor({5}, x), tensor({5}, y), ValueType::kFp32, "f");
  EXPECT_EQ(m.first_mismatch_byte, 0);
  y[2] = x[2];
  y[1] = -x[1];  // the sign: byte 3; -2.25 vs 2.25 are 2 * ord(2.25) ULP apart
  m = compare_tensors(tensor({5}, x), tensor({5}, y), ValueType::kFp32, "f");
  EXPECT_EQ(m.first_mismatch, 1);
  EXPECT_EQ(m.first_mismatch_byte, 3);
  EXPECT_EQ(m.max_ulp, 2.0 * bits32(2.25f));
  EXPECT_EQ(m.max_abs, 4.5);
  EXPECT_EQ(m.max_abs_index, 1);
}

// ULP distance through zero and across a binade.
TEST(CompareTensors, UlpDistance) {
  // 0x0001 (smallest +subnormal) vs 0x8001 (its negative): 1 + 1 = 2 apart through +-0.
  // 0x3F7F (just below 1) vs 0x3F80 (1): adjacent patterns, 1 apart.
  // 0x3F80 vs 0x3F82: 2 apart.
  const TensorMetrics a = compare_tensors(tensor({1}, {bf16(0x0001)}), tensor({1}, {bf16(0x8001)}), ValueType::kBf16, "u");
  const TensorMetrics b = compare_tensors(tensor({1}, {bf16(0x3F7F)}), tensor({1}, {bf16(0x3F80)}), ValueType::kBf16, "u");
  const TensorMetrics c = compare_tensors(tensor({1}, {bf16(0x3F80)}), tensor({1}, {bf16(0x3F82)}), ValueType::kBf16, "u");
  EXPECT_EQ(a.max_ulp, 2);
  EXPECT_EQ(b.max_ulp, 1);
  EXPECT_EQ(c.max_ulp, 2);
  EXPECT_EQ(c.max_abs, 1.0 / 64.0);  // 1 + 2 * 2^-7 vs 1
}

TEST(CompareTensors, SignedZeroDiffersInBitsOnly) {
  // +0 is 0x0000 and -0 is 0x8000: the bits differ in byte 1; the values are equal.
  const std::vector<float> x = {1.0f, 0.0f, 2.0f};
  const std::vector<float> y = {1.0f, -0.0f, 2.0f};
  const TensorMetrics m = compare_tensors(tensor({3}, x), tensor({3}, y), ValueType::kBf16, "z");
  EXPECT_EQ(m.bit_equal, 2);
  EXPECT_EQ(m.first_mismatch, 1);
  EXPECT_EQ(m.first_mismatch_byte, 1);
  EXPECT_EQ(m.max_abs, 0);
  EXPECT_EQ(m.max_abs_index, -1);
  EXPECT_EQ(m.max_ulp, 0);
  EXPECT_EQ(m.nmse, 0);
}

TEST(CompareTensors, NanOnOneSideIsCountedAndLeftOutOfTheNorms) {
  // Finite pairs 0, 1, 3: differences 0, 0, -1; sum a^2 = 1 + 4 + 16 = 21 -> nmse 1/21.
  const TensorMetrics m = compare_tensors(tensor({4}, {1, 2, 3, 4}), tensor({4}, {1, 2, kNaN, 5}), ValueType::kBf16, "n");
  EXPECT_EQ(m.nan_mismatch, 1);
  EXPECT_EQ(m.inf_mismatch, 0);
  EXPECT_EQ(m.nonfinite_a, 0);
  EXPECT_EQ(m.nonfinite_b, 1);
  EXPECT_EQ(m.first_mismatch, 2);
  EXPECT_DOUBLE_EQ(m.nmse, 1.0 / 21.0);
  EXPECT_EQ(m.max_abs, 1);
  EXPECT_EQ(m.max_abs_index, 3);
  EXPECT_EQ(m.max_ulp, 32);  // 4 = 0x4080, 5 = 0x40A0
  EXPECT_FALSE(std::isnan(m.b_rms));
}

TEST(CompareTensors, NanOnBothSidesIsNotANanMismatch) {
  // Two NaN patterns: no NaN mismatch, but the bits differ (bf16 0x7FC0 vs 0xFFC0, byte 1).
  const TensorMetrics m = compare_tensors(tensor({2}, {bf16(0x7FC0), 1}), tensor({2}, {bf16(0xFFC0), 1}), ValueType::kBf16, "n");
  EXPECT_EQ(m.nan_mismatch, 0);
  EXPECT_EQ(m.nonfinite_a, 1);
  EXPECT_EQ(m.nonfinite_b, 1);
  EXPECT_EQ(m.bit_equal, 1);
  EXPECT_EQ(m.first_mismatch_byte, 1);
  EXPECT_EQ(m.nmse, 0);
  EXPECT_FALSE(m.a_all_zero);
}

TEST(CompareTensors, InfMasks) {
  // 0: Inf vs -Inf (opposite signs), 1: Inf vs Inf (equal), 2: -Inf vs 3 (one side),
  // 3: NaN vs Inf (a NaN mismatch, not an Inf one), 4: 1 vs 1.
  const TensorMetrics m = compare_tensors(tensor({5}, {kInf, kInf, -kInf, kNaN, 1}),
                                          tensor({5}, {-kInf, kInf, 3, kInf, 1}), ValueType::kBf16, "inf");
  EXPECT_EQ(m.inf_mismatch, 2);
  EXPECT_EQ(m.nan_mismatch, 1);
  EXPECT_EQ(m.nonfinite_a, 4);
  EXPECT_EQ(m.nonfinite_b, 3);
  EXPECT_EQ(m.bit_equal, 2);
  EXPECT_EQ(m.first_mismatch, 0);
  EXPECT_EQ(m.max_abs, 0);  // the only finite pair is 1 vs 1
  EXPECT_EQ(m.nmse, 0);
}

TEST(CompareTensors, IdenticalIsExactAndZerosAreFlagged) {
  const std::vector<float> x = random_bf16("tensors/bf16/[17,3]", 51);
  const TensorMetrics m = compare_tensors(tensor({17, 3}, x), tensor({17, 3}, x), ValueType::kBf16, "x");
  EXPECT_TRUE(m.exact());
  EXPECT_EQ(m.bit_equal_frac, 1);
  EXPECT_EQ(m.first_mismatch, -1);
  EXPECT_TRUE(m.first_mismatch_coord.empty());
  EXPECT_EQ(m.nmse, 0);
  EXPECT_GT(m.a_rms, 0);
  EXPECT_EQ(m.a_rms, m.b_rms);
  const TensorMetrics z = compare_tensors(tensor({3}, {0.0f, -0.0f, 0.0f}), tensor({3}, {0.0f, 0.0f, 1.0f}), ValueType::kBf16, "z");
  EXPECT_TRUE(z.a_all_zero);
  EXPECT_FALSE(z.b_all_zero);
  EXPECT_EQ(z.a_rms, 0);
  EXPECT_EQ(z.nmse, 1);  // A is all zero: sum (a-b)^2 = 1
}

TEST(CompareTensors, Errors) {
  const std::string shape = error_of([] {
    compare_tensors(Tensor<float>({2, 3}), Tensor<float>({3, 2}), ValueType::kFp32, "layer7.h");
  });
  EXPECT_THAT(shape, HasSubstr("layer7.h"));
  EXPECT_THAT(shape, HasSubstr("[2, 3]"));
  EXPECT_THAT(shape, HasSubstr("[3, 2]"));
  // 1 + 2^-20 is an fp32 value but not a bf16 one.
  const float not_bf16 = from32(0x3F800008u);
  const std::string bf = error_of([&] {
    compare_tensors(tensor({2}, {1, 1}), tensor({2}, {1, not_bf16}), ValueType::kBf16, "layer7.q");
  });
  EXPECT_THAT(bf, HasSubstr("layer7.q"));
  EXPECT_THAT(bf, HasSubstr("side B flat index 1"));
  EXPECT_NO_THROW(compare_tensors(tensor({2}, {1, 1}), tensor({2}, {1, not_bf16}), ValueType::kFp32, "f"));
}

// ---- logits ----

TEST(CompareLogits, KlOfTwoElementDistributions) {
  // p = softmax(0, 1) = (1, e) / (1 + e), q = softmax(1, 0) = (e, 1) / (1 + e); log p - log q =
  // (-1, 1), so KL(p || q) = (e - 1) / (e + 1).
  const double e = std::exp(1.0);
  LogitMetrics m = compare_logits({0, 1}, {1, 0}, 0.0);
  EXPECT_NEAR(m.kl, (e - 1) / (e + 1), 1e-15);
  EXPECT_EQ(m.vocab, 2);
  EXPECT_EQ(m.max_abs, 1);
  EXPECT_EQ(m.nmse, 2);  // sum d^2 = 2, sum a^2 = 1
  // p = softmax(0, ln 3) = (1/4, 3/4), q = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2). ln 3 is
  // rounded to fp32, so the tight check uses p of the fp32 value, the loose one p = (1/4, 3/4).
  const float ln3 = std::log(3.0f);
  const double pe = std::exp(static_cast<double>(ln3)) / (1 + std::exp(static_cast<double>(ln3)));
  m = compare_logits({0, ln3}, {5, 5}, 0.0);
  EXPECT_NEAR(m.kl, (1 - pe) * std::log((1 - pe) / 0.5) + pe * std::log(pe / 0.5), 1e-15);
  EXPECT_NEAR(m.kl, 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  EXPECT_GT(m.kl, 0);
}

TEST(CompareLogits, ShiftedLogitsHaveZeroKl) {
  // b = a + 4 (exact in fp32): the same distribution, a large max |d|.
  const std::vector<float> a = {0.5f, -3.25f, 7.0f, 2.0f, 1.0f};
  std::vector<float> b = a;
  for (float& v : b) v += 4.0f;
  const LogitMetrics m = compare_logits(a, b, 0.0);
  EXPECT_NEAR(m.kl, 0, 1e-15);
  EXPECT_GE(m.kl, 0);
  EXPECT_EQ(m.max_abs, 4);
  EXPECT_TRUE(m.top1_agree);
  EXPECT_EQ(m.top1_a, 2);
  EXPECT_EQ(m.margin_a, 5);  // 7 - 2
  EXPECT_EQ(m.flip, FlipClass::kNone);
}

TEST(CompareLogits, EqualIsNone) {
  const std::vector<float> a = {1, 9, 3};
  const LogitMetrics m = compare_logits(a, a, 0.0);
  EXPECT_EQ(m.kl, 0);
  EXPECT_EQ(m.max_abs, 0);
  EXPECT_EQ(m.nmse, 0);
  EXPECT_EQ(m.top1_a, 1);
  EXPECT_EQ(m.top1_b, 1);
  EXPECT_EQ(m.flip, FlipClass::kNone);
  EXPECT_STREQ(name(m.flip), "none");
}

TEST(CompareLogits, TieFlipIsNearTie) {
  // A ties at 5 (indices 1 and 2): its top-1 is the lower index 1, margin 0. B prefers 2.
  const LogitMetrics m = compare_logits({1, 5, 5, 2}, {1, 5, 5.5f, 2}, 0.0);
  EXPECT_EQ(m.top1_a, 1);
  EXPECT_EQ(m.top1_b, 2);
  EXPECT_FALSE(m.top1_agree);
  EXPECT_EQ(m.margin_a, 0);
  EXPECT_EQ(m.flip, FlipClass::kNearTie);
  EXPECT_STREQ(name(m.flip), "near_tie");
}

TEST(CompareLogits, BigMarginFlipIsSubstantive) {
  // A: 10 vs next best 2, margin 8. The bound decides: 0.5 < 8 substantive, 8 <= 8 near tie.
  const LogitMetrics m = compare_logits({0, 10, 2}, {0, 1, 12}, 0.5);
  EXPECT_EQ(m.margin_a, 8);
  EXPECT_EQ(m.top1_b, 2);
  EXPECT_EQ(m.flip, FlipClass::kSubstantive);
  EXPECT_STREQ(name(m.flip), "substantive");
  EXPECT_EQ(compare_logits({0, 10, 2}, {0, 1, 12}, 8.0).flip, FlipClass::kNearTie);
}

TEST(CompareLogits, NonFiniteLogits) {
  // B has a NaN: the metrics are NaN; top-1 ignores NaN: A's 1 vs B's 2 -> substantive.
  LogitMetrics m = compare_logits({0, 3, 1}, {0, kNaN, 1}, 100.0);
  EXPECT_EQ(m.nonfinite_a, 0);
  EXPECT_EQ(m.nonfinite_b, 1);
  EXPECT_TRUE(std::isnan(m.kl));
  EXPECT_TRUE(std::isnan(m.nmse));
  EXPECT_TRUE(std::isnan(m.max_abs));
  EXPECT_EQ(m.top1_b, 2);
  EXPECT_EQ(m.flip, FlipClass::kSubstantive);
  // +Inf at A's top-1 on both sides: same top-1, no flip, metrics still NaN.
  m = compare_logits({0, kInf, 1}, {0, kInf, 2}, 0.0);
  EXPECT_EQ(m.nonfinite_a, 1);
  EXPECT_TRUE(m.top1_agree);
  EXPECT_EQ(m.flip, FlipClass::kNone);
  EXPECT_TRUE(std::isnan(m.kl));
}

TEST(CompareLogits, Errors) {
  EXPECT_THAT(error_of([] { compare_logits({1, 2, 3}, {1, 2}, 0.0, "step 4 logits"); }),
              HasSubstr("step 4 logits"));
  EXPECT_THAT(error_of([] { compare_logits({}, {}, 0.0); }), HasSubstr("empty"));
}

// ---- index sets ----

TEST(CompareIndexSets, PermutedRowsAreEqual) {
  const IndexMetrics m = compare_index_sets(rows(2, 3, {3, 1, 2, 7, 5, 6}), rows(2, 3, {2, 3, 1, 5, 6, 7}), nullptr,
                                            0.0, "topk");
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.rows_equal, 2);
  EXPECT_TRUE(m.exact());
  EXPECT_EQ(m.min_jaccard, 1);
  EXPECT_EQ(m.first_row_differs, -1);
  EXPECT_TRUE(m.tie_equivalent);
  EXPECT_EQ(m.max_tie_band, -1);
  ASSERT_EQ(m.per_row.size(), 2u);
  EXPECT_EQ(m.per_row[0].size_a, 3);
  EXPECT_EQ(m.per_row[0].tie_band, -1);
  EXPECT_TRUE(std::isnan(m.per_row[0].score_gap_at_k));
}

TEST(CompareIndexSets, PaddingIsIgnoredAndWidthsMayDiffer) {
  // k = 4 with -1 padding vs k = 2: the same set {2, 4}.
  IndexMetrics m = compare_index_sets(rows(1, 4, {4, -1, 2, -1}), rows(1, 2, {2, 4}), nullptr, 0.0, "topk");
  EXPECT_TRUE(m.exact());
  EXPECT_EQ(m.per_row[0].size_a, 2);
  // {0, 1, 2, 3} vs {0, 1, 5}: common 2, union 5 -> Jaccard 2/5; recall 2/4.
  m = compare_index_sets(rows(1, 4, {0, 1, 2, 3}), rows(1, 3, {0, 1, 5}), nullptr, 0.0, "topk");
  EXPECT_EQ(m.per_row[0].common, 2);
  EXPECT_DOUBLE_EQ(m.per_row[0].jaccard, 2.0 / 5.0);
  EXPECT_DOUBLE_EQ(m.per_row[0].recall, 0.5);
  EXPECT_FALSE(m.per_row[0].tie_equivalent);  // no scores: only equal rows are
  EXPECT_FALSE(m.tie_equivalent);
}

TEST(CompareIndexSets, JaccardAndRecallArithmetic) {
  // row 0: {1,2,3,4} vs {3,4,5,6}: common 2, union 6 -> J 1/3, R 1/2
  // row 1: {} vs {}: J 1, R 1 (equal)
  // row 2: {} vs {9}: J 0/1 = 0, R 1 (A empty)
  // row 3: {8} vs {}: J 0, R 0
  const IndexMetrics m = compare_index_sets(
      rows(4, 4, {1, 2, 3, 4, -1, -1, -1, -1, -1, -1, -1, -1, 8, -1, -1, -1}),
      rows(4, 4, {3, 4, 5, 6, -1, -1, -1, -1, 9, -1, -1, -1, -1, -1, -1, -1}), nullptr, 0.0, "topk");
  EXPECT_EQ(m.rows_equal, 1);
  EXPECT_EQ(m.first_row_differs, 0);
  EXPECT_DOUBLE_EQ(m.per_row[0].jaccard, 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.per_row[0].recall, 0.5);
  EXPECT_EQ(m.per_row[1].jaccard, 1);
  EXPECT_EQ(m.per_row[2].jaccard, 0);
  EXPECT_EQ(m.per_row[2].recall, 1);
  EXPECT_EQ(m.per_row[3].recall, 0);
  EXPECT_EQ(m.min_jaccard, 0);
  EXPECT_EQ(m.min_recall, 0);
  EXPECT_DOUBLE_EQ(m.mean_jaccard, (1.0 / 3.0 + 1 + 0 + 0) / 4);
  EXPECT_DOUBLE_EQ(m.mean_recall, (0.5 + 1 + 1 + 0) / 4);
}

TEST(CompareIndexSets, ErrorsNameTheRowAndIndex) {
  const std::string dup = error_of([] {
    compare_index_sets(rows(2, 2, {1, 2, 3, 3}), rows(2, 2, {1, 2, 3, 4}), nullptr, 0.0, "layer 4 topk");
  });
  EXPECT_THAT(dup, HasSubstr("layer 4 topk"));
  EXPECT_THAT(dup, HasSubstr("side A row 1"));
  EXPECT_THAT(dup, HasSubstr("index 3"));
  EXPECT_THAT(error_of([] { compare_index_sets(rows(1, 2, {1, 2}), rows(1, 2, {5, 5}), nullptr, 0.0, "k"); }),
              HasSubstr("side B row 0 selects index 5"));
  EXPECT_THAT(error_of([] { compare_index_sets(rows(1, 2, {1, -2}), rows(1, 2, {1, 2}), nullptr, 0.0, "k"); }),
              HasSubstr("holds -2"));
  EXPECT_THAT(error_of([] { compare_index_sets(rows(2, 2, {1, 2, 3, 4}), rows(1, 2, {1, 2}), nullptr, 0.0, "k"); }),
              HasSubstr("row counts differ"));
  // With scores over N = 4 positions, an A index 4 is out of range; a B index 4 is a divergence.
  const Tensor<float> s({1, 4}, {4, 3, 2, 1}, "s");
  EXPECT_THAT(error_of([&] { compare_index_sets(rows(1, 2, {0, 4}), rows(1, 2, {0, 1}), &s, 0.0, "k"); }),
              HasSubstr("index 4 outside the 4 scored positions"));
  const IndexMetrics m = compare_index_sets(rows(1, 2, {0, 1}), rows(1, 2, {0, 4}), &s, 10.0, "k");
  EXPECT_FALSE(m.per_row[0].tie_equivalent);  // 4 is in no tie band, however wide
}

// Scores of one row, N = 9: A's top-4 under the lower-position rule is {0, 1, 2, 3} (9, 8, then 5
// at positions 2 and 3 out of the tied 2, 3, 4, 8). s_k = 5; the tie band (eps 0) is {2, 3, 4, 8};
// the best unselected score is 5 (position 4), so the gap at k is 0.
TEST(CompareIndexSets, TieBand) {
  const float ninf = -kInf;
  const Tensor<float> s({1, 9}, {9, 8, 5, 5, 5, 1, 0, ninf, 5}, "s");
  const Tensor<int32_t> a = rows(1, 4, {0, 1, 2, 3});
  const auto row = [&](std::vector<int32_t> b) {
    return compare_index_sets(a, rows(1, 4, std::move(b)), &s, 0.0, "topk").per_row[0];
  };
  const IndexRowMetrics same = row({3, 2, 1, 0});
  EXPECT_EQ(same.tie_band, 4);
  EXPECT_TRUE(same.tie_equivalent);
  EXPECT_EQ(same.score_gap_at_k, 0);
  const IndexRowMetrics tied_swap = row({0, 1, 2, 4});  // 3 -> 4: both score 5
  EXPECT_TRUE(tied_swap.tie_equivalent);
  EXPECT_DOUBLE_EQ(tied_swap.jaccard, 3.0 / 5.0);
  EXPECT_TRUE(row({0, 1, 8, 4}).tie_equivalent);        // 2, 3 -> 8, 4: all score 5
  EXPECT_FALSE(row({0, 2, 3, 4}).tie_equivalent);       // 1 (score 8) dropped
  EXPECT_FALSE(row({0, 1, 2, 5}).tie_equivalent);       // 5 (score 1) taken
  EXPECT_FALSE(row({0, 1, 2, 7}).tie_equivalent);       // 7 (score -inf) taken
  EXPECT_FALSE(compare_index_sets(a, rows(1, 3, {0, 1, 2}), &s, 0.0, "topk").per_row[0].tie_equivalent);  // sizes
  const IndexMetrics m = compare_index_sets(a, rows(1, 4, {0, 1, 2, 4}), &s, 0.0, "topk");
  EXPECT_EQ(m.rows_equal, 0);
  EXPECT_TRUE(m.tie_equivalent);
  EXPECT_EQ(m.max_tie_band, 4);
  // An infinite tie_eps puts every finite score in the band (8 of 9; position 7 is -inf).
  EXPECT_EQ(compare_index_sets(a, a, &s, std::numeric_limits<double>::infinity(), "topk").max_tie_band, 8);
}

// tie_eps widens the band: scores (3, 2, 1, 0), A = {0, 1}, s_k = 2, best unselected 1 -> gap 1.
// eps 0: band {1}; eps 1.5: band {0, 1, 2} (|3-2|, |2-2|, |1-2| <= 1.5; |0-2| is not).
TEST(CompareIndexSets, TieEps) {
  const Tensor<float> s({1, 4}, {3, 2, 1, 0}, "s");
  const IndexRowMetrics narrow = compare_index_sets(rows(1, 2, {0, 1}), rows(1, 2, {0, 2}), &s, 0.0, "k").per_row[0];
  EXPECT_EQ(narrow.tie_band, 1);
  EXPECT_EQ(narrow.score_gap_at_k, 1);
  EXPECT_FALSE(narrow.tie_equivalent);
  const IndexRowMetrics wide = compare_index_sets(rows(1, 2, {0, 1}), rows(1, 2, {0, 2}), &s, 1.5, "k").per_row[0];
  EXPECT_EQ(wide.tie_band, 3);
  EXPECT_TRUE(wide.tie_equivalent);
  EXPECT_FALSE(compare_index_sets(rows(1, 2, {0, 1}), rows(1, 2, {0, 3}), &s, 1.5, "k").per_row[0].tie_equivalent);
}

// ---- candidate pools ----

// block_size 4, N = 20 (5 whole blocks). Row 0: A keeps blocks {0, 2, 3}, B keeps {0, 2, 4}: B kept
// A's blocks but one -> block recall 2/3, and (whole blocks) token recall 8/12 = 2/3 too.
// Row 1: A keeps block 1 whole, B only position 5 of it -> block recall 1, token recall 1/4.
TEST(CompareCandidates, BlockAndTokenRecall) {
  std::vector<uint8_t> a(40, 0), b(40, 0);
  for (int blk : {0, 2, 3}) std::fill_n(a.begin() + 4 * blk, 4, 1);
  for (int blk : {0, 2, 4}) std::fill_n(b.begin() + 4 * blk, 4, 1);
  std::fill_n(a.begin() + 20 + 4, 4, 1);
  b[20 + 5] = 1;
  const CandidateMetrics m = compare_candidates(mask(2, 20, a), mask(2, 20, b), 4, "cand");
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.rows_equal, 0);
  EXPECT_EQ(m.first_row_differs, 0);
  EXPECT_DOUBLE_EQ(m.min_block_recall, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.mean_block_recall, (2.0 / 3.0 + 1) / 2);
  EXPECT_DOUBLE_EQ(m.min_token_recall, 0.25);
  EXPECT_DOUBLE_EQ(m.mean_token_recall, (2.0 / 3.0 + 0.25) / 2);
}

// N = 18, block_size 4: block 4 is the partial block {16, 17}. A keeps 17, B keeps 16: the block
// is kept on both sides (block recall 1) but the position is not (token recall 0). A row where A
// keeps nothing has recall 1.
TEST(CompareCandidates, PartialLastBlockAndEmptyRows) {
  std::vector<uint8_t> a(36, 0), b(36, 0);
  a[17] = 1;
  b[16] = 1;
  b[18 + 3] = 1;  // row 1: A empty
  const CandidateMetrics m = compare_candidates(mask(2, 18, a), mask(2, 18, b), 4, "cand");
  EXPECT_EQ(m.min_block_recall, 1);
  EXPECT_EQ(m.min_token_recall, 0);
  EXPECT_DOUBLE_EQ(m.mean_token_recall, 0.5);
  EXPECT_EQ(m.rows_equal, 0);
  const CandidateMetrics same = compare_candidates(mask(2, 18, a), mask(2, 18, a), 4, "cand");
  EXPECT_TRUE(same.exact());
  EXPECT_EQ(same.mean_token_recall, 1);
}

TEST(CompareCandidates, Errors) {
  EXPECT_THAT(error_of([] { compare_candidates(mask(1, 4, {0, 1, 0, 0}), mask(1, 3, {0, 1, 0}), 2, "layer 6 cand"); }),
              HasSubstr("layer 6 cand"));
  EXPECT_THAT(error_of([] { compare_candidates(mask(1, 4, {0, 1, 0, 0}), mask(1, 4, {0, 2, 0, 0}), 2, "c"); }),
              HasSubstr("holds 2 at row 0 position 1"));
  EXPECT_THAT(error_of([] { compare_candidates(mask(1, 4, {0, 1, 0, 0}), mask(1, 4, {0, 1, 0, 0}), 0, "c"); }),
              HasSubstr("block_size"));
}

// Row 0: B's pool {0..4}; A = {1, 2, 7}, B = {1, 8}: A inside the pool {1, 2}, of which B has {1}
// -> 1/2. Row 1: A = {7, 8} lies outside the pool -> 1. Mean 3/4.
TEST(RecallWithinCandidates, CountsOnlyThePool) {
  std::vector<uint8_t> mb(20, 0);
  std::fill_n(mb.begin(), 5, 1);
  std::fill_n(mb.begin() + 10, 5, 1);
  const double r = recall_within_candidates(rows(2, 3, {1, 2, 7, 7, 8, -1}), rows(2, 2, {1, 8, 0, 1}), mask(2, 10, mb));
  EXPECT_DOUBLE_EQ(r, 0.75);
  EXPECT_THAT(error_of([&] { recall_within_candidates(rows(2, 1, {10, 0}), rows(2, 1, {0, 0}), mask(2, 10, mb), "lvl2"); }),
              HasSubstr("lvl2: side A row 0 selects index 10"));
}

// ---- bytes and integers ----

TEST(CompareBytes, FirstMismatchingEntryAndByte) {
  // 3 entries of 5 bytes; byte 7 = entry 1, offset 2; byte 13 = entry 2, offset 3.
  std::vector<uint8_t> a(15), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(17 * i + 3);
  b = a;
  b[13] ^= 0x80;
  b[7] ^= 0x01;
  const BytesMetrics m = compare_bytes(a, b, 5, "kv");
  EXPECT_EQ(m.entries, 3);
  EXPECT_EQ(m.entries_equal, 1);
  EXPECT_EQ(m.bytes, 15);
  EXPECT_EQ(m.bytes_equal, 13);
  EXPECT_EQ(m.first_mismatch_entry, 1);
  EXPECT_EQ(m.first_mismatch_byte, 2);
  EXPECT_FALSE(m.exact());
  EXPECT_TRUE(compare_bytes(a, a, 5, "kv").exact());
  EXPECT_THAT(error_of([&] { compare_bytes(a, std::vector<uint8_t>(14), 5, "layer 2 kv"); }), HasSubstr("layer 2 kv"));
  EXPECT_THAT(error_of([&] { compare_bytes(a, b, 4, "kv"); }), HasSubstr("4-byte entries"));
}

TEST(CompareInts, FirstMismatch) {
  const IntMetrics m = compare_ints({5, 6, 7, 8}, {5, 0, 7, 0}, "experts");
  EXPECT_EQ(m.count, 4);
  EXPECT_EQ(m.equal, 2);
  EXPECT_EQ(m.first_mismatch, 1);
  EXPECT_THAT(error_of([] { compare_ints({1}, {1, 2}, "engram ids"); }), HasSubstr("engram ids"));
}

TEST(Names, ValueType) {
  EXPECT_STREQ(name(ValueType::kBf16), "bf16");
  EXPECT_STREQ(name(ValueType::kFp32), "fp32");
}

// ---- properties ----

#if DSV41_METRICS_PROPERTIES

// A [T, k] index tensor of distinct indices in [0, n) per row, -1 padded at random slots.
Tensor<int32_t> gen_index_rows(int64_t t, int64_t k, int32_t n) {
  std::vector<int32_t> v;
  for (int64_t r = 0; r < t; ++r) {
    std::vector<int32_t> row = *rc::gen::unique<std::vector<int32_t>>(
        static_cast<size_t>(*rc::gen::inRange<int64_t>(0, k + 1)), rc::gen::inRange<int32_t>(0, n));
    row.resize(static_cast<size_t>(k), -1);
    std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());  // padding at random slots
    std::shuffle(row.begin(), row.end(), rng);
    v.insert(v.end(), row.begin(), row.end());
  }
  return rows(t, k, v);
}

RC_GTEST_PROP(MetricsProperty, SelfComparisonOfBf16IsExact, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(0, 64);
  std::vector<float> x;
  for (int64_t i = 0; i < n; ++i) x.push_back(bf16(*rc::gen::arbitrary<uint16_t>()));
  const TensorMetrics m = compare_tensors(tensor({n}, x), tensor({n}, x), ValueType::kBf16, "x");
  RC_ASSERT(m.exact());
  RC_ASSERT(m.nan_mismatch == 0 && m.inf_mismatch == 0 && m.first_mismatch == -1);
  RC_ASSERT(m.max_ulp == 0 && m.max_abs == 0 && m.nmse == 0);
}

// Adjacent bf16 patterns of the same sign are 1 ULP apart in either order.
RC_GTEST_PROP(MetricsProperty, AdjacentBf16PatternsAreOneUlpApart, ()) {
  const uint32_t sign = *rc::gen::element<uint32_t>(0u, 0x8000u);
  const uint32_t mag = *rc::gen::inRange<uint32_t>(0, 0x7F80 - 1);  // mag and mag + 1 finite
  const float x = bf16(sign | mag), y = bf16(sign | (mag + 1));
  RC_ASSERT(compare_tensors(tensor({1}, {x}), tensor({1}, {y}), ValueType::kBf16, "u").max_ulp == 1);
  RC_ASSERT(compare_tensors(tensor({1}, {y}), tensor({1}, {x}), ValueType::kBf16, "u").max_ulp == 1);
}

RC_GTEST_PROP(MetricsProperty, JaccardIsSymmetricAndSelfRecallIsOne, ()) {
  const int64_t t = *rc::gen::inRange<int64_t>(1, 6), k = *rc::gen::inRange<int64_t>(1, 9);
  const int32_t n = *rc::gen::inRange<int32_t>(static_cast<int32_t>(k), 20);
  const Tensor<int32_t> a = gen_index_rows(t, k, n), b = gen_index_rows(t, k, n);
  const IndexMetrics ab = compare_index_sets(a, b, nullptr, 0.0, "ab");
  const IndexMetrics ba = compare_index_sets(b, a, nullptr, 0.0, "ba");
  const IndexMetrics aa = compare_index_sets(a, a, nullptr, 0.0, "aa");
  for (int64_t r = 0; r < t; ++r) {
    RC_ASSERT(ab.per_row[r].jaccard == ba.per_row[r].jaccard);
    RC_ASSERT(aa.per_row[r].recall == 1.0);
  }
  RC_ASSERT(aa.exact() && aa.min_jaccard == 1.0);
}

// For masks made of whole blocks, block recall equals token recall (so block recall 1 with token
// recall < 1 cannot happen).
RC_GTEST_PROP(MetricsProperty, WholeBlockMasksHaveEqualBlockAndTokenRecall, ()) {
  const int bs = *rc::gen::inRange(1, 6);
  const int64_t nb = *rc::gen::inRange<int64_t>(1, 8);
  std::vector<uint8_t> a, b;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t ka = *rc::gen::inRange<uint8_t>(0, 2), kb = *rc::gen::inRange<uint8_t>(0, 2);
    a.insert(a.end(), static_cast<size_t>(bs), ka);
    b.insert(b.end(), static_cast<size_t>(bs), kb);
  }
  const CandidateMetrics m = compare_candidates(mask(1, nb * bs, a), mask(1, nb * bs, b), bs, "c");
  RC_ASSERT(std::fabs(m.min_block_recall - m.min_token_recall) <= 1e-15);
}

#endif  // DSV41_METRICS_PROPERTIES

}  // namespace
}  // namespace dsv41::scenarios::judge
