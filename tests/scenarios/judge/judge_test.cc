// tests/scenarios/judge/judge_test.cc: the judge's one rule (scenarios/judge/judge.h), which every
// verb uses to turn a metric into a verdict: measured without a tolerance, fail beyond the bound
// (and always for NaN), pass within; tolerance rules matched in order; the first divergence found
// where the rows say.
#include "scenarios/judge/judge.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/metrics.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace dsv41::scenarios::judge {
namespace {

using reports::MetricRow;
using reports::Verdict;

TEST(Judge, NoToleranceIsMeasuredNeverAPass) {
  EXPECT_EQ(judge_value(0.0, std::nullopt), Verdict::kMeasured);
  EXPECT_EQ(judge_value(std::nan(""), std::nullopt), Verdict::kMeasured);
}

TEST(Judge, LowerIsBetterBoundsPassUpToTheBoundAndFailBeyond) {
  const reports::Tolerance t = make_tolerance(1e-6, false, "derived", "a note");
  EXPECT_EQ(t.origin, "derived");
  EXPECT_EQ(t.note, "a note");
  EXPECT_EQ(judge_value(0.0, t), Verdict::kPass);
  EXPECT_EQ(judge_value(1e-6, t), Verdict::kPass);
  EXPECT_EQ(judge_value(std::nextafter(1e-6, 1.0), t), Verdict::kFail);
  EXPECT_EQ(judge_value(std::numeric_limits<double>::infinity(), t), Verdict::kFail);
}

TEST(Judge, HigherIsBetterBoundsAndAZeroBound) {
  const reports::Tolerance frac = make_tolerance(1.0, true, "stated");
  EXPECT_EQ(judge_value(1.0, frac), Verdict::kPass);
  EXPECT_EQ(judge_value(0.999999, frac), Verdict::kFail);
  const reports::Tolerance zero = make_tolerance(0.0, false, "stated");
  EXPECT_EQ(judge_value(0.0, zero), Verdict::kPass);
  EXPECT_EQ(judge_value(1e-300, zero), Verdict::kFail);
}

TEST(Judge, NanIsBeyondEveryBoundEitherWay) {
  EXPECT_EQ(judge_value(std::nan(""), make_tolerance(1e300, false, "stated")), Verdict::kFail);
  EXPECT_EQ(judge_value(std::nan(""), make_tolerance(-1e300, true, "stated")), Verdict::kFail);
}

TEST(Judge, JudgeRowSetsTheVerdictFromValueAndTolerance) {
  MetricRow r;
  r.value = 0.5;
  judge_row(r);
  EXPECT_EQ(r.verdict, Verdict::kMeasured);
  r.tolerance = make_tolerance(0.25, false, "stated");
  judge_row(r);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  r.value = 0.25;
  judge_row(r);
  EXPECT_EQ(r.verdict, Verdict::kPass);
}

TEST(Judge, TheFirstMatchingRuleBoundsAMetric) {
  const std::vector<ToleranceRule> rules = {
      {"attn_out", "nmse", make_tolerance(1e-5, false, "stated")},
      {"hc_*", "nmse", make_tolerance(1e-4, false, "stated")},
      {"*", "nmse", make_tolerance(1e-3, false, "stated")},
      {"attn_out", "nmse", make_tolerance(1.0, false, "stated")}};  // never reached: the first wins
  ASSERT_NE(rule_for(rules, "attn_out", "nmse"), nullptr);
  EXPECT_EQ(rule_for(rules, "attn_out", "nmse")->tolerance.bound, 1e-5);
  EXPECT_EQ(rule_for(rules, "hc_ffn_pre", "nmse")->tolerance.bound, 1e-4);
  EXPECT_EQ(rule_for(rules, "ffn_out", "nmse")->tolerance.bound, 1e-3);
  EXPECT_EQ(rule_for(rules, "ffn_out", "max_ulp"), nullptr);
  EXPECT_TRUE(component_matches("cache.*", "cache.window_kv"));
  EXPECT_FALSE(component_matches("cache.*", "cachex"));
  EXPECT_FALSE(component_matches("attn_out", "attn_out_x"));
}

TEST(Judge, DivergenceAtNamesTheRowsPlace) {
  MetricRow r;
  r.step = 3;
  r.session = 1;
  r.position = 77;
  r.layer = 5;
  r.component = "topk";
  r.metric = "rows_equal_frac";
  r.value = 0.75;
  const reports::Divergence d = divergence_at(r);
  EXPECT_EQ(d.step, 3);
  EXPECT_EQ(d.session, 1);
  EXPECT_EQ(d.position, 77);
  EXPECT_EQ(d.layer, 5);
  EXPECT_EQ(d.component, "topk");
  EXPECT_EQ(d.metric, "rows_equal_frac");
  EXPECT_EQ(d.value, 0.75);
}

TEST(Judge, AComparisonWithAFailingRowFailsAndWithoutEvidenceIsInconclusive) {
  reports::Comparison cmp;
  MetricRow ok;
  ok.metric = "nmse";
  ok.value = 0;
  ok.tolerance = make_tolerance(0, false, "stated");
  judge_row(ok);
  cmp.rows.push_back(ok);
  cmp.items_compared = 0;  // nothing compared: never a pass
  EXPECT_EQ(comparison_verdict(cmp, Expectation::kBitExact, Evidence{}), Verdict::kInconclusive);
  ASSERT_FALSE(cmp.notes.empty());
  EXPECT_EQ(cmp.notes.back(), "nothing was compared");
  cmp.items_compared = 1;
  EXPECT_EQ(comparison_verdict(cmp, Expectation::kBitExact, Evidence{}), Verdict::kPass);
  EXPECT_EQ(comparison_verdict(cmp, Expectation::kMeasured, Evidence{}), Verdict::kMeasured);
  MetricRow bad = ok;
  bad.value = std::nan("");
  judge_row(bad);
  cmp.rows.push_back(bad);
  EXPECT_EQ(comparison_verdict(cmp, Expectation::kBitExact, Evidence{}), Verdict::kFail);
}

}  // namespace
}  // namespace dsv41::scenarios::judge

// ---- Routed experts' ties (scenarios/judge/derived_bounds.h expert_score_band, metrics.h
// compare_index_sets_banded): an expert swapped for one whose biased score lies inside the row's
// band is a tie; outside it, not.

TEST(ExpertTies, TheScoreBandGrowsWithTheReductionAndItsMagnitude) {
  using dsv41::scenarios::judge::expert_score_band;
  const double small = expert_score_band(0.3, 10.0, 64, 1.0, 1.2);
  EXPECT_GT(small, 0.0);
  EXPECT_TRUE(std::isfinite(small));
  EXPECT_GT(expert_score_band(0.3, 10.0, 4096, 1.0, 1.2), small);
  EXPECT_GT(expert_score_band(0.3, 100.0, 64, 1.0, 1.2), small);
  EXPECT_LT(small, 1e-4) << "a band of a few fp32 ulps of the scores, not a loose tolerance";
}

TEST(ExpertTies, ASwapInsideTheRowsBandIsATieAndOutsideItIsNot) {
  using dsv41::reference::Tensor;
  const Tensor<float> scores({2, 4}, {1.0f, 0.9999f, 0.5f, 0.2f, 0.9f, 0.8f, 0.3f, 0.1f}, "biased");
  const Tensor<int32_t> a({2, 1}, {0, 0}, "a");
  const Tensor<int32_t> b({2, 1}, {1, 0}, "b");  // row 0 takes expert 1 (0.0001 below expert 0)
  const dsv41::scenarios::judge::IndexMetrics tie =
      dsv41::scenarios::judge::compare_index_sets_banded(a, b, scores, {2e-4, 2e-4}, "experts");
  EXPECT_EQ(tie.rows, 2);
  EXPECT_EQ(tie.rows_equal, 1);
  EXPECT_EQ(tie.first_row_differs, 0);
  EXPECT_TRUE(tie.tie_equivalent);
  const dsv41::scenarios::judge::IndexMetrics not_tie =
      dsv41::scenarios::judge::compare_index_sets_banded(a, b, scores, {1e-5, 2e-4}, "experts");
  EXPECT_FALSE(not_tie.tie_equivalent);
  const Tensor<int32_t> far({2, 1}, {0, 1}, "far");  // row 1 takes an expert 0.1 below: no band covers it
  EXPECT_FALSE(dsv41::scenarios::judge::compare_index_sets_banded(a, far, scores, {2e-4, 2e-4}, "experts").tie_equivalent);
  EXPECT_THROW(dsv41::scenarios::judge::compare_index_sets_banded(a, b, scores, {2e-4}, "experts"), dsv41::Error);
}

// ---- The shape of a float difference (metrics.h error_shape): a gain is correlated with the
// values, an offset has a mean, rounding noise neither; the ULP histogram counts the distances.

TEST(ErrorShape, AGainAnOffsetAndNoiseAreToldApart) {
  using dsv41::scenarios::judge::ValueType;
  std::vector<float> a(64), gain(64), offset(64), noise(64);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 1.0f + 0.25f * static_cast<float>(i % 8);  // exact in fp32
    gain[i] = a[i] * 1.01f;
    offset[i] = a[i] + 0.01f;
    noise[i] = std::nextafter(a[i], (i % 2) ? 10.0f : -10.0f);  // one fp32 ulp, alternating sign
  }
  const auto g = dsv41::scenarios::judge::error_shape(a, gain, ValueType::kFp32, "gain");
  const auto o = dsv41::scenarios::judge::error_shape(a, offset, ValueType::kFp32, "offset");
  const auto n = dsv41::scenarios::judge::error_shape(a, noise, ValueType::kFp32, "noise");
  EXPECT_GT(g.corr, 0.99);
  EXPECT_GT(o.mean_over_rms, 0.99);
  EXPECT_LT(std::fabs(n.mean_over_rms), 0.2);
  EXPECT_EQ(n.ulp_hist[1], 64) << "every noisy value one ulp away";
  EXPECT_EQ(g.ulp_hist[0], 0);
  const auto same = dsv41::scenarios::judge::error_shape(a, a, ValueType::kFp32, "same");
  EXPECT_EQ(same.ulp_hist[0], 64);
  EXPECT_TRUE(std::isnan(same.corr)) << "no error: undefined, not 0";
  EXPECT_NE(dsv41::scenarios::judge::describe(g).find("ulps 0/1/2-4/5-16/>16"), std::string::npos);
}
