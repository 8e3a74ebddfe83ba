// Sampled teacher-forced replay (scenarios/runner/replay_plan.h, docs/scale.md): the sample is
// deterministic and holds the required steps, ref vs ref passes on the sampled steps only, a
// planted defect at a sampled step fails there and one at an unsampled step is never a pass, the
// global bytes held equal `dsv41 bytes`, and bad replay specs are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <tuple>

#include "base/error.h"
#include "reference/session/byte_accounting.h"
#include "scenarios/runner/replay_plan.h"
#include "scenarios/runner/runner.h"
#include "tests/support/runner_fixture.h"

namespace dsv41::scenarios::runner {
namespace {

using reports::Comparison;
using reports::MetricRow;
using reports::ScenarioResult;
using reports::Verdict;

// Steps: 0-4 prefill (5 chunks of 40), 5-7 decode, 8 resume, 9 prefill, 10-11 decode, 12-13 rounds.
std::string scenario_json(const std::string& replay) {
  return R"({"name": "sampled", "seed": 41, "check_bytes": true, "events": [
    {"prompt": [{"random": 200}], "chunk": 40}, {"decode": 3}, {"resume": true},
    {"prompt": [{"random": 20}]}, {"decode": 2}, {"speculate": 2, "drafts": "dspark", "policy": "fixed:3"}],
    "pairs": [{"a": "ref@global", "b": "ref@global", "expect": "bitexact", "why": "the same computation")" +
         replay + R"(}], "modes": ["teacher-forced"]})";
}

Scenario scenario(const std::string& replay = R"(, "replay": {"extra": 1})") {
  return parse_scenario(scenario_json(replay), "sampled_replay_test");
}

ReplaySample sample_of(const Scenario& s, const ReplaySpec& spec) {
  return sample_replay_steps(s, plan_tokens(s, test::oracle_resources().config.vocab_size), spec);
}

TEST(SampledReplay, SampleIsDeterministicAndHoldsTheRequiredSteps) {
  const Scenario s = scenario();
  ReplaySpec spec;
  spec.extra = 3;
  const ReplaySample a = sample_of(s, spec), b = sample_of(s, spec);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.seed, stream_seed(41, "replay"));
  EXPECT_EQ(a.total, 14);
  // First and last chunk of each prompt, each resume and the step after it, the first decode step
  // and the first round of each event.
  for (int64_t required : {0, 4, 5, 8, 9, 10, 12}) {
    EXPECT_TRUE(std::count(a.steps.begin(), a.steps.end(), required)) << "step " << required;
  }
  EXPECT_EQ(a.steps.size(), a.required.size() + 3);
  EXPECT_TRUE(std::is_sorted(a.steps.begin(), a.steps.end()));
  EXPECT_EQ(std::set<int64_t>(a.steps.begin(), a.steps.end()).size(), a.steps.size());
  spec.seed = 7;
  EXPECT_EQ(sample_of(s, spec).seed, 7u);
  spec.extra = 1000;  // more than remain: every step
  EXPECT_EQ(static_cast<int64_t>(sample_of(s, spec).steps.size()), 14);
}

// --sides names another pair: the scenario's sampled replay still holds (a scale scenario's steps
// are sampled whatever the sides; without it every step's index scores would be captured).
TEST(SampledReplay, SidesFromTheCommandLineKeepTheScenariosReplay) {
  RunOptions o;
  o.sides = {"ref", "ref-order:splitk"};
  const ScenarioPlan plan = plan_scenario(scenario(), test::oracle_resources().config, o);
  ASSERT_EQ(plan.pairs.size(), 1u);
  ASSERT_TRUE(plan.pairs[0].replay.has_value());
  EXPECT_EQ(plan.pairs[0].replay->extra, 1);
  ASSERT_EQ(plan.replay.size(), 1u);
  ASSERT_TRUE(plan.replay[0].has_value());
  EXPECT_LT(plan.replay[0]->steps.size(), 14u);
  const ScenarioPlan full = plan_scenario(scenario(""), test::oracle_resources().config, o);  // no replay declared
  ASSERT_EQ(full.pairs.size(), 1u);
  EXPECT_FALSE(full.pairs[0].replay.has_value());
}

const ScenarioResult& twin_run() {
  static const ScenarioResult r = run_scenario(scenario(), test::oracle_resources(), RunOptions{});
  return r;
}

TEST(SampledReplay, RefVsRefPassesOnTheSampledStepsOnly) {
  const ScenarioResult& r = twin_run();
  ASSERT_EQ(r.comparisons.size(), 1u);
  const Comparison& c = r.comparisons[0];
  test::expect_real_evidence(c);
  EXPECT_EQ(c.verdict, Verdict::kPass) << (c.notes.empty() ? "" : c.notes.front());
  ASSERT_TRUE(c.replay.has_value());
  EXPECT_EQ(c.replay->steps_total, 14);
  EXPECT_EQ(static_cast<int64_t>(c.replay->steps_checked.size()), c.steps_compared);
  EXPECT_LT(c.steps_compared, 14);
  std::set<int64_t> row_steps;
  for (const MetricRow& m : c.rows) row_steps.insert(m.step);
  for (int64_t s : row_steps) {
    EXPECT_TRUE(std::count(c.replay->steps_checked.begin(), c.replay->steps_checked.end(), s)) << "step " << s;
  }
  ASSERT_EQ(c.sides.size(), 2u);
  for (const reports::SideMeasure& m : c.sides) {
    EXPECT_GT(m.seconds, 0);
    EXPECT_EQ(m.peak_device_bytes, -1);  // host sides
  }
  EXPECT_EQ(r.steps.size(), 14u);  // every step is listed, checked or not
}

// Side B's replays run on a worker thread beside side A (RunOptions::replay_beside_a, the default);
// run after each of A's steps instead, the comparison is the same: rows (in the same order, with
// the same values), acceptance rows, verdict and notes.
TEST(SampledReplay, ReplayBesideSideAGivesTheSameReportAsReplayAfterIt) {
  RunOptions serial;
  serial.replay_beside_a = false;
  const ScenarioResult s = run_scenario(scenario(), test::oracle_resources(), serial);
  const ScenarioResult& p = twin_run();
  ASSERT_EQ(s.comparisons.size(), 1u);
  ASSERT_EQ(p.comparisons.size(), 1u);
  const Comparison &a = s.comparisons[0], &b = p.comparisons[0];
  test::expect_real_evidence(a);
  EXPECT_EQ(a.verdict, b.verdict);
  EXPECT_EQ(a.notes, b.notes);
  EXPECT_EQ(a.steps_compared, b.steps_compared);
  EXPECT_EQ(a.items_compared, b.items_compared);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  ASSERT_GT(a.rows.size(), 100u);
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const MetricRow &x = a.rows[i], &y = b.rows[i];
    ASSERT_EQ(std::tie(x.step, x.layer, x.component, x.metric), std::tie(y.step, y.layer, y.component, y.metric))
        << "row " << i;
    EXPECT_TRUE(x.value == y.value || (std::isnan(x.value) && std::isnan(y.value)))
        << "row " << i << " " << x.component << " " << x.metric << ": " << x.value << " vs " << y.value;
  }
  ASSERT_EQ(a.acceptance.size(), b.acceptance.size());
  EXPECT_GT(a.acceptance.size(), 0u);
  for (size_t i = 0; i < a.acceptance.size(); ++i) {
    EXPECT_EQ(a.acceptance[i].step, b.acceptance[i].step);
    EXPECT_EQ(a.acceptance[i].side, b.acceptance[i].side);
  }
}

TEST(SampledReplay, GlobalBytesPerTokenEqualDsv41Bytes) {
  const Comparison& c = twin_run().comparisons[0];
  const reference::ModelConfig& cfg = test::oracle_resources().config;
  int checks = 0;
  for (const MetricRow& m : c.rows) {
    if (m.component.rfind("global_bytes.", 0) != 0) continue;
    const double expected =
        static_cast<double>(reference::session::global_bytes_for_tokens(reference::session::byte_accounting(cfg), m.position)) /
        static_cast<double>(m.position);
    if (m.metric == "bytes_per_token") {
      EXPECT_GT(m.value, 0);
      EXPECT_EQ(m.value, expected) << m.component << " after " << m.position << " tokens";
      ++checks;
    }
    if (m.metric == "held_minus_expected") {
      EXPECT_EQ(m.verdict, Verdict::kPass);
    }
  }
  EXPECT_EQ(checks, 4);  // sides a and b after each of the two prompts
}

ScenarioResult run_mutant(const std::string& mutant) {
  RunOptions o;
  o.sides = {"ref@global", mutant + "@global"};
  o.replay_extra = 1;
  return run_scenario(scenario(""), test::oracle_resources(), o);
}

TEST(SampledReplay, ADefectAtASampledStepFailsThere) {
  const ScenarioResult r = run_mutant("mutant:attn_out:L3:S9");  // step 9: the resumption's first step
  const Comparison& c = r.comparisons[0];
  EXPECT_EQ(c.verdict, Verdict::kFail);
  ASSERT_TRUE(c.first_divergence.has_value());
  EXPECT_EQ(c.first_divergence->step, 9);
  EXPECT_EQ(c.first_divergence->layer, 3);
  EXPECT_EQ(c.first_divergence->component, "attn_out");
}

TEST(SampledReplay, ADefectAtAnUnsampledStepIsUncheckedNotPassed) {
  const Scenario s = scenario("");
  ReplaySpec spec;
  spec.extra = 1;
  const ReplaySample sample = sample_of(s, spec);
  int64_t unsampled = -1;
  for (int64_t step : {1, 2, 3, 6, 7}) {
    if (!std::count(sample.steps.begin(), sample.steps.end(), step)) unsampled = step;
  }
  ASSERT_GE(unsampled, 0);
  const ScenarioResult r = run_mutant("mutant:attn_out:L3:S" + std::to_string(unsampled));
  const Comparison& c = r.comparisons[0];
  EXPECT_EQ(c.verdict, Verdict::kInconclusive);
  EXPECT_FALSE(c.first_divergence.has_value());
}

TEST(SampledReplay, BadReplaySpecsAreRefused) {
  EXPECT_THROW(scenario(R"(, "replay": {"extra": -1})"), Error);
  EXPECT_THROW(scenario(R"(, "replay": 3)"), Error);
  EXPECT_THROW(scenario(R"(, "replay": {"extra": 1, "steps": 3})"), Error);
  EXPECT_THROW(scenario(R"(, "replay": {"seed": -4})"), Error);
  const reference::ModelConfig& cfg = test::oracle_resources().config;
  RunOptions free;
  free.modes = {"free-running"};
  try {
    plan_scenario(scenario(), cfg, free);
    ADD_FAILURE() << "a free-running replay was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("teacher-forced steps only"), std::string::npos) << e.what();
  }
  RunOptions seed_only;
  seed_only.replay_seed = 3;
  EXPECT_THROW(plan_scenario(scenario(""), cfg, seed_only), Error);
  RunOptions negative;
  negative.replay_extra = -2;
  EXPECT_THROW(plan_scenario(scenario(""), cfg, negative), Error);
}

}  // namespace
}  // namespace dsv41::scenarios::runner

namespace dsv41::scenarios::runner {
namespace {

TEST(SampledReplay, TheLargestScoreMatrixIsKnownBeforeTheRun) {
  // The oracle config's index sources include ratio-1 layers: the last 40-token chunk of the
  // 200-token prompt (step 4) reaches 200 keys: [40, 200] fp32.
  const ScenarioPlan plan = plan_scenario(scenario(), test::oracle_resources().config, RunOptions{});
  EXPECT_EQ(plan.largest_scores_step, 4);
  EXPECT_EQ(plan.largest_scores_bytes, 40 * 200 * 4);
}

}  // namespace
}  // namespace dsv41::scenarios::runner
