// DSpark-drafted speculative rounds in the scenario runner (scenarios/runner/rounds.h, "drafts": "dspark")
// on the tiny oracle model (window 64, a 64-slot DSpark ring, block 5, ratio-2 compressors on
// layers 2..5): the draft itself (every dspark_* output), the kept positions, the accept
// decisions and every cache including the DSpark rings are bit-exact between a speculative side
// and a plain side; the draft-side planted defects ("DSpark ring not rolled back", "draft position
// 1+ uses position 0's RoPE") are caught and located; sampling-mode rounds replay exactly.
//
// The prompt is 70 tokens, so every round runs past the rings' wrap (position 64): a rejected
// position's slot held an earlier position, and a ring that is not rolled back changes what the
// next draft reads. Where a defect is located depends on which rounds accept partially: that is
// read from a clean run's acceptance table (side A's decision), not assumed.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "base/error.h"
#include "scenarios/runner/runner.h"
#include "tests/support/oracle_model.h"
#include "tests/support/runner_fixture.h"

namespace dsv41::scenarios::runner {
namespace {

using reports::AcceptanceRow;
using reports::Comparison;
using reports::MetricRow;
using reports::Verdict;

const BackendResources& resources() { return test::oracle_resources(); }

// Four DSpark rounds (fixed:5), a decode step, two more under threshold:0.3, two under survival:0.05;
// with a seed for every stream (printed by the runner).
std::string scenario_json(const std::string& round_extra = "") {
  return R"({
  "name": "dspark_rounds", "seed": 41,
  "events": [
    {"prompt": [{"random": 70}]},
    {"speculate": 4, "drafts": "dspark", "policy": "fixed:5")" + round_extra + R"(},
    {"decode": 1},
    {"speculate": 2, "drafts": "dspark", "policy": "threshold:0.3")" + round_extra + R"(},
    {"speculate": 2, "drafts": "dspark", "policy": "survival:0.05")" + round_extra + R"(}
  ],
  "pairs": [], "modes": ["free-running"]
})";
}

Comparison run(const std::string& a, const std::string& b, const std::string& mode = "free-running",
               const std::string& round_extra = "") {
  RunOptions o;
  o.sides = {a, b};
  o.modes = {mode};
  return run_scenario(parse_scenario(scenario_json(round_extra), "dspark_runner_test"), resources(), o)
      .comparisons.at(0);
}

using test::expect_real_evidence;

std::string where(const Comparison& c) {
  if (!c.first_divergence) return "no divergence";
  return c.first_divergence->component + " layer " + std::to_string(c.first_divergence->layer) + " step " +
         std::to_string(c.first_divergence->step) + ": " + c.first_divergence->detail;
}

// The rounds (steps) where side A kept fewer drafts than it verified.
std::set<int64_t> partial_rounds(const Comparison& c) {
  std::set<int64_t> out;
  for (const AcceptanceRow& a : c.acceptance) {
    if (a.side == "a" && a.kept < a.verified) out.insert(a.step);
  }
  return out;
}

TEST(DSparkRunner, SpeculativeWithDSparkDraftsEqualsPlainDecodingBitForBit) {
  const Comparison c = run("ref/plain", "ref");
  expect_real_evidence(c);
  EXPECT_EQ(c.verdict, Verdict::kPass) << where(c);
  // Every round compared the draft, the kept positions, the decision and the DSpark rings.
  const int n_layers = resources().config.n_layers;
  std::map<int64_t, std::set<std::string>> seen;
  bool nonzero_ring = false;
  for (const MetricRow& r : c.rows) {
    seen[r.step].insert(r.component);
    if (r.component == "cache.dspark_window_kv") {
      EXPECT_EQ(r.layer, n_layers);
      nonzero_ring = true;
    }
  }
  EXPECT_TRUE(nonzero_ring);
  int rounds = 0;
  for (const auto& [step, comps] : seen) {
    if (!comps.count("accept")) continue;
    ++rounds;
    SCOPED_TRACE("step " + std::to_string(step));
    for (const char* comp : {"dspark_attn_out", "dspark_logits", "dspark_token", "dspark_confidence", "attn_out",
                             "logits", "cache.dspark_window_kv", "cache.compressor", "cache.window_kv"}) {
      EXPECT_TRUE(comps.count(comp)) << comp;
    }
  }
  EXPECT_EQ(rounds, 8);
  EXPECT_FALSE(partial_rounds(c).empty()) << "no round rolled back: the scenario tests nothing";
}

TEST(DSparkRunner, AcceptanceRowsCarryTheDraftsConfidence) {
  const Comparison c = run("ref", "ref");
  EXPECT_EQ(c.verdict, Verdict::kPass) << where(c);
  ASSERT_FALSE(c.acceptance.empty());
  const int64_t B = resources().config.dspark_block_size;
  std::map<std::pair<int64_t, std::string>, double> survival;  // running product per (round, side)
  for (const AcceptanceRow& a : c.acceptance) {
    SCOPED_TRACE("step " + std::to_string(a.step) + " draft " + std::to_string(a.draft_index));
    EXPECT_EQ(a.proposed, B);
    EXPECT_GE(a.verified, 1);
    EXPECT_LE(a.verified, B);
    ASSERT_TRUE(std::isfinite(a.confidence));
    EXPECT_GT(a.confidence, 0.0);
    EXPECT_LT(a.confidence, 1.0);
    double& s = survival.try_emplace({a.step, a.side}, 1.0).first->second;
    s *= a.confidence;
    EXPECT_DOUBLE_EQ(a.predicted_survival, s);
    if (a.draft_index >= a.verified) {
      EXPECT_EQ(a.realised, -1);
    }
  }
}

TEST(DSparkRunner, TeacherForcedAndSamplingRoundsReplayExactly) {
  const Comparison tf = run("ref", "ref", "teacher-forced");
  expect_real_evidence(tf);
  EXPECT_EQ(tf.verdict, Verdict::kPass) << where(tf);
  // Sampling: the drafts drawn at T = 0.9 and the accept rule's draws come from the scenario's
  // seeded streams, so two runs of the same side give the same bits.
  const Comparison s = run("ref", "ref", "free-running", R"(, "temperature": 0.9, "top_p": 0.95)");
  expect_real_evidence(s);
  EXPECT_EQ(s.verdict, Verdict::kPass) << where(s);
  bool sampled_accept = false;  // a sampled accept probability strictly between 0 and 1
  for (const AcceptanceRow& a : s.acceptance) sampled_accept = sampled_accept || (a.accept_prob > 0 && a.accept_prob < 1);
  EXPECT_TRUE(sampled_accept) << "the rounds never sampled: the test proves nothing about sampling";
}

TEST(DSparkRunner, RingNotRolledBackIsLocatedAtTheFirstPartialAccept) {
  const std::set<int64_t> partial = partial_rounds(run("ref", "ref"));
  ASSERT_FALSE(partial.empty());
  for (const std::string mode : {"free-running", "teacher-forced"}) {
    SCOPED_TRACE(mode);
    const Comparison c = run("ref", "mutant:rollback_dspark:S0", mode);
    expect_real_evidence(c);
    ASSERT_EQ(c.verdict, Verdict::kFail) << where(c);
    EXPECT_EQ(c.first_divergence->step, *partial.begin()) << where(c);
    EXPECT_EQ(c.first_divergence->layer, resources().config.n_layers);
    EXPECT_EQ(c.first_divergence->component, "cache.dspark_window_kv") << where(c);
  }
}

TEST(DSparkRunner, DraftRopeAtBlockStartIsLocatedInTheDraftAttention) {
  // From step 3 (a round): the draft of that round is wrong from its attention on; side A's
  // drafts are the proposal, so nothing of the target differs.
  for (const std::string mode : {"free-running", "teacher-forced"}) {
    SCOPED_TRACE(mode);
    const Comparison c = run("ref", "mutant:draft_rope_pos0:S3", mode);
    expect_real_evidence(c);
    ASSERT_EQ(c.verdict, Verdict::kFail) << where(c);
    EXPECT_EQ(c.first_divergence->step, 3);
    EXPECT_EQ(c.first_divergence->layer, resources().config.n_layers);
    EXPECT_EQ(c.first_divergence->component, "dspark_attn_out") << where(c);
  }
  // Step 5 is the decode step: it fires in the next round, step 6.
  const Comparison d = run("ref", "mutant:draft_rope_pos0:S5");
  ASSERT_EQ(d.verdict, Verdict::kFail) << where(d);
  EXPECT_EQ(d.first_divergence->step, 6);
}

TEST(DSparkRunner, DSparkDraftsNeedDSparkBlocks) {
  reference::ModelConfig c = resources().config;
  c.n_mtp_layers = 0;
  RunOptions o;
  o.sides = {"ref", "ref"};
  try {
    plan_scenario(parse_scenario(scenario_json(), "t"), c, o);
    FAIL() << "a dspark speculate event on a config without DSpark blocks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_mtp_layers = 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41::scenarios::runner
