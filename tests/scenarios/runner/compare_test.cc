// The runner's comparison of one step (scenarios/runner/compare.h) on hand-made captures: the
// candidate pool follows topk's tie rule (a pool that differs only in blocks tied at A's last kept
// block score is tie_equivalent, and the detail says "tie"; any other difference is not), and a
// cache entry that does not decode is a failure under every checked expectation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "scenarios/runner/compare.h"

namespace dsv41::scenarios::runner {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using reference::Tensor;

constexpr int kBlock = 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A step of one row and 32 compressed positions (4 candidate blocks of 8): index scores whose
// block maxima are `block_max` (each block's other positions lower), and the pool keeping `kept`.
StepCapture step_with_pool(const std::vector<float>& block_max, const std::vector<int>& kept) {
  StepCapture s;
  CapturedItem scores;
  scores.layer = 0;
  scores.component = "index_scores";
  scores.kind = CapturedItem::kFloat;
  scores.type = judge::ValueType::kFp32;
  scores.f = Tensor<float>({1, 32}, "index_scores", 0.0f);
  for (int b = 0; b < 4; ++b) {
    for (int j = 0; j < kBlock; ++j) scores.f.data()[static_cast<size_t>(b * kBlock + j)] = block_max[static_cast<size_t>(b)] - 0.5f * static_cast<float>(j);
  }
  CapturedItem pool;
  pool.layer = 0;
  pool.component = "candidates";
  pool.kind = CapturedItem::kMask;
  pool.m = Tensor<uint8_t>({1, 32}, "candidates", 0);
  for (int b : kept) {
    for (int j = 0; j < kBlock; ++j) pool.m.data()[static_cast<size_t>(b * kBlock + j)] = 1;
  }
  s.items = {scores, pool};
  return s;
}

CompareContext bitexact() {
  CompareContext ctx;
  ctx.expect = judge::Expectation::kBitExact;
  ctx.candidate_block_size = kBlock;
  return ctx;
}

const reports::MetricRow* row(const StepComparison& c, const std::string& component, const std::string& metric) {
  for (const reports::MetricRow& r : c.rows) {
    if (r.component == component && r.metric == metric) return &r;
  }
  return nullptr;
}

TEST(CompareCandidates, APoolDifferingOnlyInATiedBlockIsTieEquivalent) {
  // Blocks 1 and 2 tie at 3.0 for the last of 3 places (block 3 is the newest: pinned).
  const StepCapture a = step_with_pool({5.0f, 3.0f, 3.0f, 1.0f}, {0, 1, 3});
  const StepCapture b = step_with_pool({5.0f, 3.0f, 3.0f, 1.0f}, {0, 2, 3});
  const StepComparison c = compare_step(a, b, bitexact());
  const reports::MetricRow* eq = row(c, "candidates", "rows_equal_frac");
  const reports::MetricRow* tie = row(c, "candidates", "tie_equivalent");
  ASSERT_NE(eq, nullptr);
  ASSERT_NE(tie, nullptr);
  EXPECT_EQ(eq->value, 0.0);  // the pools differ: a bit-exact pair still fails (its tie rule is the reference's)
  EXPECT_EQ(eq->verdict, reports::Verdict::kFail);
  EXPECT_EQ(tie->value, 1.0);
  EXPECT_THAT(c.first_failure_detail, HasSubstr("tie"));
  EXPECT_THAT(c.first_failure_detail, Not(HasSubstr("not a tie")));
  ASSERT_NE(row(c, "candidates", "tie_band_max"), nullptr);
  EXPECT_GE(row(c, "candidates", "tie_band_max")->value, 2.0);  // blocks 1 and 2
}

TEST(CompareCandidates, APoolDifferingOutsideTheTieBandIsNotATie) {
  const StepCapture a = step_with_pool({5.0f, 3.0f, 2.5f, 1.0f}, {0, 1, 3});
  const StepCapture b = step_with_pool({5.0f, 3.0f, 2.5f, 1.0f}, {0, 2, 3});
  const StepComparison c = compare_step(a, b, bitexact());
  ASSERT_NE(row(c, "candidates", "tie_equivalent"), nullptr);
  EXPECT_EQ(row(c, "candidates", "tie_equivalent")->value, 0.0);
  EXPECT_THAT(c.first_failure_detail, HasSubstr("not a tie"));

  // A tie band wide enough to hold 2.5 (0.2 x the largest |score| 5 = 1.0 around 3.0) makes it one.
  CompareContext wide = bitexact();
  wide.topk_tie_rel = 0.2;
  EXPECT_EQ(row(compare_step(a, b, wide), "candidates", "tie_equivalent")->value, 1.0);
}

TEST(CompareCandidates, EqualPoolsAndNoScoresToAnalyse) {
  const StepCapture a = step_with_pool({5.0f, 3.0f, 3.0f, 1.0f}, {0, 1, 3});
  const StepComparison same = compare_step(a, a, bitexact());
  EXPECT_EQ(row(same, "candidates", "rows_equal_frac")->value, 1.0);
  EXPECT_EQ(row(same, "candidates", "tie_equivalent")->value, 1.0);
  // Without index_scores on side A there is no tie analysis (no tie rows), only the exact rows.
  StepCapture thin = a;
  thin.items.erase(thin.items.begin());
  const StepComparison c = compare_step(thin, thin, bitexact());
  EXPECT_EQ(row(c, "candidates", "tie_equivalent"), nullptr);
  EXPECT_EQ(row(c, "candidates", "rows_equal_frac")->value, 1.0);
}

// A compressed_kv cache of 4 entries packed from real values; `negate_scale` flips the sign bit of
// entry 2's first E4M3 scale (0x29 -> 0xA9 in the dump).
reference::model::CacheView kv_cache(bool negate_scale) {
  const int rows = 4, dim = 64;
  std::vector<float> x(static_cast<size_t>(rows * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(static_cast<float>(static_cast<int>(i % 13) - 6), -3);
  reference::model::CacheView v;
  v.kind = "compressed_kv";
  v.layer = 2;
  v.format = formats::CacheFormat::kCompressedKvFp4;
  v.dim = dim;
  v.entry_bytes = formats::entry_bytes(v.format, dim);
  v.entries = rows;
  v.bytes = formats::pack_rows(v.format, x, rows, dim);
  v.positions = {0, 1, 2, 3};
  if (negate_scale) v.bytes[static_cast<size_t>(2 * v.entry_bytes + dim / 2)] |= 0x80;
  return v;
}

TEST(CompareCaches, AnEntryThatDoesNotDecodeFailsUnderEveryCheckedExpectation) {
  StepCapture a, b;
  a.caches = {kv_cache(false)};
  b.caches = {kv_cache(true)};
  ASSERT_FALSE(std::all_of(a.caches[0].bytes.begin(), a.caches[0].bytes.end(), [](uint8_t x) { return x == 0; }));
  for (judge::Expectation e : {judge::Expectation::kBitExact, judge::Expectation::kTolerance}) {
    CompareContext ctx = bitexact();
    ctx.expect = e;
    std::vector<judge::ToleranceRule> rules = default_tolerance_rules();
    ctx.rules = &rules;
    const StepComparison c = compare_step(a, b, ctx);
    const reports::MetricRow* v = row(c, "cache.compressed_kv", "valid_entries_frac");
    ASSERT_NE(v, nullptr);
    EXPECT_DOUBLE_EQ(v->value, 0.75);
    EXPECT_EQ(v->verdict, reports::Verdict::kFail) << judge::name(e);
    ASSERT_TRUE(v->tolerance.has_value());
    EXPECT_EQ(v->tolerance->origin, e == judge::Expectation::kBitExact ? "stated" : "analytic");
    EXPECT_THAT(c.first_failure_detail, HasSubstr("side B: 1 of 4 entries invalid; entry 2 (position 2)"));
    EXPECT_THAT(c.first_failure_detail, HasSubstr("not a positive finite scale"));
  }
  // Both sides valid: the row passes.
  b.caches = {kv_cache(false)};
  const StepComparison ok = compare_step(a, b, bitexact());
  EXPECT_EQ(row(ok, "cache.compressed_kv", "valid_entries_frac")->value, 1.0);
  EXPECT_EQ(row(ok, "cache.compressed_kv", "valid_entries_frac")->verdict, reports::Verdict::kPass);
}

}  // namespace
}  // namespace dsv41::scenarios::runner
