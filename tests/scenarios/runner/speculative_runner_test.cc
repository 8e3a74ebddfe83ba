// Speculative rounds in the scenario runner (scenarios/runner/rounds.h) on the tiny oracle model:
// speculative decoding equals plain one-token decoding bit for bit (the kept positions' outputs,
// the accept decisions, every cache after each rollback); the speculative planted defects are
// caught and located; the acceptance table follows the scenario's corruption; bad speculate
// events and pairs are refused with clear errors.
//
// The scenario below fixes every accept length by construction: the drafts are side A's own greedy
// continuation ("lookahead:5", what a perfect greedy drafter proposes) with draft i corrupted
// (reject_at), so a greedy verifier accepts exactly i drafts (m = i), or all 5 for -1. With a
// 40-token prompt the rounds run at (tiny config: ratio-2 compressors on layers 2..5, window 64):
//   step 1: P = 40, m = 2, keeps 40..42 -> 43: one token pending in every ratio-2 group, and the
//           rejected rows 43..45 completed that group and started the next: the compressors'
//           pending slot 0 must be rolled back
//   step 2: P = 43, m = 0, keeps 43 -> 44 (no token pending)
//   step 3: P = 44, m = 5 (nothing corrupted): keeps 44..49 -> 50, nothing to roll back
//   step 4: P = 50, m = 3, keeps 50..53 -> 54 (no token pending)
//   step 5: decode one token at 54; step 6: P = 55, m = 1 -> 57: one pending, rows 57..60 rolled back
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "base/error.h"
#include "scenarios/runner/runner.h"
#include "tests/support/error_of.h"
#include "tests/support/oracle_model.h"
#include "tests/support/runner_fixture.h"

namespace dsv41::scenarios::runner {
namespace {

using reports::AcceptanceRow;
using reports::Comparison;
using reports::MetricRow;
using reports::ScenarioResult;
using reports::Verdict;

const BackendResources& resources() { return test::oracle_resources(); }

std::string scenario_json(const std::string& extra_event = "") {
  return R"({
  "name": "spec_rounds", "seed": 31,
  "events": [
    {"prompt": [{"random": 40}]},
    {"speculate": 4, "drafts": "lookahead:5", "policy": "fixed:5", "reject_at": [2, 0, -1, 3]},
    {"decode": 1},
    {"speculate": 1, "drafts": "lookahead:5", "policy": "fixed:5", "reject_at": [1]})" +
         extra_event + R"(
  ],
  "pairs": [], "modes": ["free-running"]
})";
}

// The accept length each round's corruption forces (see the header), by step.
const std::map<int64_t, int64_t> kAccepted = {{1, 2}, {2, 0}, {3, 5}, {4, 3}, {6, 1}};

ScenarioResult run(const std::string& a, const std::string& b, const std::string& mode = "free-running") {
  RunOptions o;
  o.sides = {a, b};
  o.modes = {mode};
  return run_scenario(parse_scenario(scenario_json(), "speculative_runner_test"), resources(), o);
}

using test::expect_real_evidence;

TEST(SpeculativeRunner, SpeculativeEqualsPlainDecodingBitForBit) {
  const ScenarioResult r = run("ref/plain", "ref");
  ASSERT_EQ(r.comparisons.size(), 1u);
  const Comparison& c = r.comparisons[0];
  expect_real_evidence(c);
  EXPECT_EQ(c.expectation, "bitexact");
  EXPECT_EQ(c.verdict, Verdict::kPass) << (c.first_divergence ? c.first_divergence->component + " step " +
                                                                   std::to_string(c.first_divergence->step)
                                                             : "");
  // Every round compared its kept positions, its accept decision and the compressors' pending
  // groups after the rollback.
  std::map<int64_t, std::map<std::string, int>> seen;
  for (const MetricRow& row : c.rows) ++seen[row.step][row.component];
  for (const auto& [step, m] : kAccepted) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (const char* comp : {"attn_out", "topk", "candidates", "logits", "accept", "cache.compressed_kv",
                             "cache.window_kv", "cache.compressor"}) {
      EXPECT_GT(seen[step][comp], 0) << comp;
    }
  }
  // The steps: a round's tokens are its kept positions; a partial accept is marked.
  for (const reports::StepInfo& s : r.steps) {
    if (!kAccepted.count(s.step)) continue;
    EXPECT_EQ(s.phase, "speculate");
    EXPECT_EQ(s.tokens, kAccepted.at(s.step) + 1) << "step " << s.step;
    const bool partial = kAccepted.at(s.step) < 5;
    EXPECT_EQ(std::count(s.boundaries.begin(), s.boundaries.end(), "partial_accept"), partial ? 1 : 0);
  }
}

TEST(SpeculativeRunner, AcceptanceTableFollowsTheCorruption) {
  const Comparison c = run("ref", "ref/plain").comparisons.at(0);
  ASSERT_FALSE(c.acceptance.empty());
  std::map<std::pair<int64_t, std::string>, int> rows;
  for (const AcceptanceRow& a : c.acceptance) {
    SCOPED_TRACE("step " + std::to_string(a.step) + " side " + a.side);
    ASSERT_TRUE(kAccepted.count(a.step));
    ++rows[{a.step, a.side}];
    EXPECT_EQ(a.proposed, 5);
    EXPECT_EQ(a.verified, 5);
    EXPECT_EQ(a.accepted, kAccepted.at(a.step));
    EXPECT_EQ(a.kept, kAccepted.at(a.step));
    EXPECT_GE(a.next_token, 0);
    EXPECT_TRUE(std::isnan(a.confidence)) << "lookahead drafts carry no confidence";
    const int want = a.draft_index < a.accepted ? 1 : a.draft_index == a.accepted ? 0 : -1;
    EXPECT_EQ(a.realised, want) << "draft " << a.draft_index;
  }
  for (const auto& [step, m] : kAccepted) {
    EXPECT_EQ((rows[{step, "a"}]), 5);
    EXPECT_EQ((rows[{step, "b"}]), 5);
  }
}

struct SpecDefect {
  std::string spec;
  int64_t step;
  int layer;
  std::string component;
};

class SpeculativeDefect : public testing::TestWithParam<SpecDefect> {};

// Located at the first round at or after its step where it changes something (header table).
TEST_P(SpeculativeDefect, CaughtAndLocatedInBothModes) {
  const SpecDefect& p = GetParam();
  for (const std::string mode : {"free-running", "teacher-forced"}) {
    SCOPED_TRACE(mode);
    const Comparison c = run("ref", p.spec, mode).comparisons.at(0);
    expect_real_evidence(c);
    ASSERT_EQ(c.verdict, Verdict::kFail);
    ASSERT_TRUE(c.first_divergence.has_value());
    EXPECT_EQ(c.first_divergence->step, p.step);
    EXPECT_EQ(c.first_divergence->layer, p.layer);
    EXPECT_EQ(c.first_divergence->component, p.component);
    EXPECT_FALSE(c.first_divergence->detail.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Runner, SpeculativeDefect,
    // rollback_compressor from step 0: step 1 leaves a token pending over a rolled-back group
    // boundary, so the first ratio-2 layer's (2) pending slot differs after the rollback.
    // From step 2: steps 2, 4 leave nothing pending, step 3 rolls nothing back: step 6.
    // accept_one_more: the first round at or after its step with a rejected draft.
    testing::Values(SpecDefect{"mutant:rollback_compressor:S0", 1, 2, "cache.compressor"},
                    SpecDefect{"mutant:rollback_compressor:S2", 6, 2, "cache.compressor"},
                    SpecDefect{"mutant:accept_one_more:S1", 1, -1, "accept"},
                    SpecDefect{"mutant:accept_one_more:S3", 4, -1, "accept"}),
    [](const testing::TestParamInfo<SpecDefect>& i) {
      std::string n = i.param.spec.substr(7);
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

TEST(SpeculativeRunner, ADefectThatNeverAppliesIsInconclusive) {
  // Step 7 does not exist: the defect never fires, and the comparison proves nothing about it.
  const Comparison c = run("ref", "mutant:rollback_compressor:S7").comparisons.at(0);
  EXPECT_EQ(c.verdict, Verdict::kInconclusive);
}

TEST(SpeculativeRunner, ValueDefectsDoNotFireInsideARound) {
  // attn_out at step 1 (a round): a value planted in a rolled-back row would vanish, so value
  // defects fire on ordinary steps only; here it never does.
  const Comparison c = run("ref", "mutant:attn_out:L3:S1").comparisons.at(0);
  EXPECT_EQ(c.verdict, Verdict::kInconclusive);
  // At step 5 (a decode step) it does, and is caught there.
  const Comparison d = run("ref", "mutant:attn_out:L3:S5").comparisons.at(0);
  ASSERT_EQ(d.verdict, Verdict::kFail);
  EXPECT_EQ(d.first_divergence->step, 5);
}

TEST(SpeculativeRunner, BadEventsAndPairsAreRefused) {
  const auto parse = [](const std::string& event) {
    return test::error_of([&] { parse_scenario(scenario_json(",\n    " + event), "bad"); });
  };
  EXPECT_NE(parse(R"({"speculate": 0})").find("events[4].speculate: must be > 0"), std::string::npos);
  EXPECT_NE(parse(R"({"speculate": 2, "policy": "fast:3"})").find("unknown kind 'fast'"), std::string::npos);
  EXPECT_NE(parse(R"({"speculate": 2, "drafts": "lookahead:0"})").find("lookahead:N needs N in [1, 64]"),
            std::string::npos);
  EXPECT_NE(parse(R"({"speculate": 2, "drafts": "lookahead:3", "policy": "threshold:0.5"})").find("no confidence"),
            std::string::npos);
  EXPECT_NE(parse(R"({"speculate": 2, "drafts": "lookahead:3", "temperature": 0.7})").find("must be dspark"),
            std::string::npos);
  EXPECT_NE(parse(R"({"speculate": 2, "reject_at": [-2]})").find("reject_at"), std::string::npos);
  EXPECT_NE(parse(R"({"decode": 2, "policy": "fixed:2"})").find("policy belongs to a speculate event"),
            std::string::npos);
  // A plain side cannot be teacher-forced against a speculative one (different steps).
  RunOptions o;
  o.sides = {"ref", "ref/plain"};
  o.modes = {"teacher-forced"};
  const std::string e = test::error_of([&] {
    plan_scenario(parse_scenario(scenario_json(), "t"), resources().config, o);
  });
  EXPECT_NE(e.find("run it free-running"), std::string::npos) << e;
  EXPECT_NE(test::error_of([] { parse_side("ref@cold/plainx"); }).find("unknown cache path"), std::string::npos);
  EXPECT_EQ(parse_side("ref@full/plain").text(), "ref@full/plain");
}

}  // namespace
}  // namespace dsv41::scenarios::runner
