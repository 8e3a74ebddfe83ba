// The runner's order-variant backends (ref-order:<variant>, scenarios/runner/backend.h) and the
// tolerance expectation judged by the derived bounds (scenarios/judge/order_variant.h,
// docs/scenarios.md "Order-variant pairs"), on the tiny oracle model: a correct reordered variant
// passes a small scenario in both modes (no false alarm), a 1% gain on one row of a variant's
// attn_out or ffn_out is flagged at that component, layer and step, an explicit scenario rule wins
// over the derived bound, and bad backend names are refused with the known ones.
#include <gtest/gtest.h>

#include <ostream>
#include <set>
#include <string>
#include <tuple>

#include "base/error.h"
#include "scenarios/defects/reordered_ops.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/runner.h"
#include "scenarios/runner/verdict.h"
#include "tests/support/runner_fixture.h"
#include "tests/support/small_scenario.h"

namespace dsv41::scenarios::runner {
namespace {

using reports::Comparison;
using reports::MetricRow;
using reports::Verdict;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Steps: 0, 1 prefill chunks; 2, 3 decode; 4 resume; 5 prompt; 6 decode.
Scenario small_scenario(const std::string& extra = "") {
  return parse_scenario(test::small_scenario_json("\"pairs\": []" + extra), "order_variant_runner_test");
}

std::vector<Comparison> run(const Scenario& s, const std::string& b, std::vector<std::string> modes) {
  RunOptions o;
  o.sides = {"ref", b};
  o.modes = std::move(modes);
  return run_scenario(s, test::oracle_resources(), o).comparisons;
}

std::string describe(const Comparison& c) {
  if (!c.first_divergence) return "no divergence";
  const reports::Divergence& d = *c.first_divergence;
  return d.component + "@" + std::to_string(d.layer) + " step " + std::to_string(d.step) + " " + d.metric + " " +
         std::to_string(d.value) + " (" + d.tolerance.origin + ": " + d.tolerance.note + ")";
}

std::string error_of(const std::string& spec) {
  try {
    validate_backend_name(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OrderVariantRunner, EveryVariantIsABackendThatClaimsOrderVariant) {
  std::string catalog;
  for (const auto& [name, line] : backend_catalog()) catalog += name + ": " + line + "\n";
  EXPECT_TRUE(has(catalog, "ref-order:<variant>")) << catalog;
  for (defects::SumOrder o : defects::all_sum_orders()) {
    const std::string spec = std::string("ref-order:") + defects::name(o);
    EXPECT_EQ(error_of(spec), "") << spec;
    EXPECT_EQ(backend_claim(spec), Claim::kOrderVariant) << spec;
    EXPECT_TRUE(has(catalog, defects::name(o))) << defects::name(o);
  }
  EXPECT_EQ(backend_claim("ref-order:fma:attn_out:L2:S1:x1.01"), Claim::kOrderVariant);
  // A pair with an order-variant side expects tolerance; a replaying path stays measured.
  const Scenario s = small_scenario();
  std::string why;
  EXPECT_EQ(default_expectation(parse_side("ref"), parse_side("ref-order:fma"), s, &why), judge::Expectation::kTolerance);
  EXPECT_TRUE(has(why, "derived bound")) << why;
  EXPECT_EQ(default_expectation(parse_side("ref@cold"), parse_side("ref-order:fma@global"), s, &why),
            judge::Expectation::kMeasured);
  EXPECT_EQ(default_expectation(parse_side("ref-bf16kv"), parse_side("ref-order:fma"), s, &why),
            judge::Expectation::kMeasured);
}

TEST(OrderVariantRunner, BadNamesAreRefusedWithTheKnownOnes) {
  const std::string unknown_variant = error_of("ref-order:random");
  EXPECT_TRUE(has(unknown_variant, "unknown reordered variant 'random'")) << unknown_variant;
  EXPECT_TRUE(has(unknown_variant, "reversed, pairwise, blocked, fma, splitk, tiles")) << unknown_variant;
  EXPECT_TRUE(has(error_of("ref-order:"), "unknown reordered variant ''"));
  const std::string bad_defect = error_of("ref-order:splitk:attn_out:Lx:S1");
  EXPECT_TRUE(has(bad_defect, "ref-order:splitk:attn_out:Lx:S1") && has(bad_defect, "planted defect")) << bad_defect;
  const std::string unknown = error_of("reference-order");
  EXPECT_TRUE(has(unknown, "unknown backend 'reference-order'") && has(unknown, "ref-order:<variant>")) << unknown;
  EXPECT_THROW(make_backend("ref-order:nope", test::oracle_resources()), Error);
}

// No false alarm: a correct variant passes in both modes, and the rows show what judged it.
TEST(OrderVariantRunner, ACorrectVariantPassesBothModesJudgedByDerivedBounds) {
  const std::vector<Comparison> cs = run(small_scenario(), "ref-order:splitk", {"free-running", "teacher-forced"});
  ASSERT_EQ(cs.size(), 2u);
  for (const Comparison& c : cs) {
    SCOPED_TRACE(c.mode);
    test::expect_real_evidence(c);
    EXPECT_EQ(c.expectation, "tolerance");
    EXPECT_TRUE(has(c.expectation_origin, "order-variant")) << c.expectation_origin;
    bool changed = false;
    for (const MetricRow& r : c.rows) changed = changed || (r.metric == "bit_equal_frac" && r.value < 1.0);
    EXPECT_TRUE(changed) << "the variant changed no output: the run proves nothing";
  }
  const Comparison& fr = cs[0];
  const Comparison& tf = cs[1];
  // Free-running: a pass, or measured when a top-1 token flips (no end-to-end bound), never a fail.
  EXPECT_TRUE(fr.verdict == Verdict::kPass || fr.verdict == Verdict::kMeasured) << describe(fr);
  EXPECT_EQ(tf.verdict, Verdict::kPass) << describe(tf);
  // Teacher-forced: each float component within its derived bound (origin analytic, with its
  // derivation), the selections by the tie rule, the caches decoded within their derived bound.
  std::set<std::string> bounded;
  bool nonzero_rowrel = false;
  for (const MetricRow& r : tf.rows) {
    if (!r.tolerance || r.tolerance->origin != "analytic") continue;
    bounded.insert(r.component + " " + r.metric);
    nonzero_rowrel = nonzero_rowrel || (r.metric == "max_rowrel" && r.value > 0);
    if (r.metric == "max_rowrel") {
      EXPECT_TRUE(has(r.tolerance->note, "derived")) << r.tolerance->note;
    }
    if (r.metric == "tie_equivalent") {
      EXPECT_TRUE(has(r.tolerance->note, "tie")) << r.tolerance->note;
    }
    EXPECT_LE(r.value, r.tolerance->bound) << r.component << " " << r.metric << " step " << r.step;
  }
  EXPECT_TRUE(nonzero_rowrel);
  for (const char* want : {"attn_out max_rowrel", "attn_out row_gain", "ffn_out max_rowrel", "logits max_rowrel",
                           "logits flip_class", "topk tie_equivalent", "experts tie_equivalent",
                           "cache.window_kv decoded_rowrel", "cache.window_kv valid_entries_frac"}) {
    EXPECT_TRUE(bounded.count(want)) << want;
  }
  // No stated default rule judges an order-variant pair (docs/scenarios.md: the derived bounds do).
  for (const Comparison* c : {&fr, &tf}) {
    for (const MetricRow& r : c->rows) {
      if (r.tolerance) {
        EXPECT_FALSE(has(r.tolerance->note, "profile v1")) << r.component << " " << r.metric;
      }
    }
  }
  // Free-running: the first step's chain bounds (origin says free-running); later steps' float rows measured.
  bool chain = false, later_measured = false;
  for (const MetricRow& r : fr.rows) {
    chain = chain || (r.step == 0 && r.tolerance && has(r.tolerance->note, "free-running"));
    later_measured = later_measured || (r.step > 0 && r.component == "attn_out" && r.metric == "max_rowrel" && !r.tolerance);
  }
  EXPECT_TRUE(chain);
  EXPECT_TRUE(later_measured);
}

struct Perturbed {
  std::string spec;
  int layer;
  std::string component;
};

void PrintTo(const Perturbed& p, std::ostream* os) { *os << p.spec; }

class OrderVariantPower : public testing::TestWithParam<Perturbed> {};

// The power check: a 1% gain on one row of an order-variant side's output is still flagged, and
// located at the component, layer and step where it was planted (teacher forcing confines it).
TEST_P(OrderVariantPower, AOnePercentRowIsFlaggedAtItsComponent) {
  const Perturbed& p = GetParam();
  const std::vector<Comparison> cs = run(small_scenario(), p.spec, {"teacher-forced"});
  ASSERT_EQ(cs.size(), 1u);
  const Comparison& c = cs[0];
  test::expect_real_evidence(c);
  EXPECT_EQ(c.expectation, "tolerance");
  ASSERT_EQ(c.verdict, Verdict::kFail) << describe(c);
  ASSERT_TRUE(c.first_divergence.has_value());
  EXPECT_EQ(c.first_divergence->step, 1);
  EXPECT_EQ(c.first_divergence->layer, p.layer);
  EXPECT_EQ(c.first_divergence->component, p.component);
  EXPECT_EQ(c.first_divergence->tolerance.origin, "analytic") << describe(c);
  std::set<std::tuple<int64_t, int, std::string>> failing;
  for (const MetricRow& r : c.rows) {
    if (r.verdict == Verdict::kFail) failing.emplace(r.step, r.layer, r.component);
  }
  EXPECT_EQ(failing, (std::set<std::tuple<int64_t, int, std::string>>{{1, p.layer, p.component}})) << describe(c);
}

INSTANTIATE_TEST_SUITE_P(OrderVariantRunner, OrderVariantPower,
                         testing::Values(Perturbed{"ref-order:splitk:attn_out:L2:S1:x1.01", 2, "attn_out"},
                                         Perturbed{"ref-order:tiles:ffn_out:L4:S1:x1.01", 4, "ffn_out"}),
                         [](const testing::TestParamInfo<Perturbed>& i) { return i.param.component; });

// An explicit scenario rule wins over the derived bound (here a stated, far too tight one).
TEST(OrderVariantRunner, AnExplicitRuleOverridesTheDerivedBound) {
  const Scenario s = small_scenario(
      R"(, "tolerances": [{"component": "attn_out", "metric": "max_rowrel", "max": 1e-12, "origin": "stated",
                           "note": "test: tighter than any reordering"}])");
  const std::vector<Comparison> cs = run(s, "ref-order:pairwise", {"teacher-forced"});
  ASSERT_EQ(cs.size(), 1u);
  const Comparison& c = cs[0];
  ASSERT_EQ(c.verdict, Verdict::kFail) << describe(c);
  ASSERT_TRUE(c.first_divergence.has_value());
  EXPECT_EQ(c.first_divergence->component, "attn_out");
  EXPECT_EQ(c.first_divergence->metric, "max_rowrel");
  EXPECT_EQ(c.first_divergence->tolerance.origin, "stated");
  EXPECT_TRUE(has(c.expectation_origin, "scenario's tolerance rules win")) << c.expectation_origin;
}

}  // namespace
}  // namespace dsv41::scenarios::runner
