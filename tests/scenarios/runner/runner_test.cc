// The scenario runner (scenarios/runner/runner.h) on the tiny oracle model: a planted defect is caught
// and located to its (step, layer, component) in both comparison modes; teacher forcing confines
// it to the component that carries it; identical sides pass, the precision ablation is measured,
// a tolerance pair needs rules for every output, and the built-in suite parses.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>

#include "base/error.h"
#include "scenarios/runner/runner.h"
#include "tests/support/oracle_model.h"
#include "tests/support/runner_fixture.h"
#include "tests/support/small_scenario.h"

namespace dsv41::scenarios::runner {
namespace {

using reports::Comparison;
using reports::MetricRow;
using reports::ScenarioResult;
using reports::Verdict;

const BackendResources& resources() { return test::oracle_resources(); }

// tests/support/small_scenario.h, with the given pairs and extra keys.
// Steps: 0, 1 prefill chunks; 2, 3 decode; 4 resume; 5 prompt; 6 decode.
Scenario small_scenario(const std::string& pairs_json = "[]", const std::string& extra = "") {
  return parse_scenario(test::small_scenario_json("\"pairs\": " + pairs_json + extra), "runner_test");
}

ScenarioResult run(const Scenario& s, const std::string& a, const std::string& b, const std::string& mode) {
  RunOptions o;
  o.sides = {a, b};
  o.modes = {mode};
  return run_scenario(s, resources(), o);
}

std::set<std::tuple<int64_t, int, std::string>> failing_items(const Comparison& c) {
  std::set<std::tuple<int64_t, int, std::string>> out;
  for (const MetricRow& r : c.rows) {
    if (r.verdict == Verdict::kFail) out.emplace(r.step, r.layer, r.component);
  }
  return out;
}

using test::expect_real_evidence;

TEST(Runner, IdenticalSidesPassBitExact) {
  const ScenarioResult r = run(small_scenario(), "ref@cold", "ref@full", "free-running");
  ASSERT_EQ(r.comparisons.size(), 1u);
  const Comparison& c = r.comparisons[0];
  expect_real_evidence(c);
  EXPECT_EQ(c.expectation, "bitexact");
  EXPECT_EQ(c.verdict, Verdict::kPass) << (c.first_divergence ? c.first_divergence->component : "");
  EXPECT_EQ(c.steps_compared, 7);
  EXPECT_FALSE(c.first_divergence.has_value());
  // Every kind of output took part: streams, mHC mixes, selections, Engram ids, logits, caches.
  std::set<std::string> seen;
  for (const MetricRow& row : c.rows) seen.insert(row.component);
  for (const char* comp : {"in_stream", "hc_attn_comb", "attn_out", "ffn_out", "out_stream", "topk", "candidates",
                           "experts", "engram_ids", "index_scores", "logits", "cache.compressed_kv",
                           "cache.index_keys", "cache.window_kv"}) {
    EXPECT_TRUE(seen.count(comp)) << comp;
  }
}

struct Planted {
  std::string spec;   // mutant:<component>:L<layer>:S<step>
  int64_t step;
  int layer;
  std::string component;
};

class PlantedDefect : public testing::TestWithParam<Planted> {};

TEST_P(PlantedDefect, CaughtAndLocatedInBothModes) {
  const Planted& p = GetParam();
  for (const std::string mode : {"free-running", "teacher-forced"}) {
    SCOPED_TRACE(mode);
    const ScenarioResult r = run(small_scenario(), "ref", p.spec, mode);
    ASSERT_EQ(r.comparisons.size(), 1u);
    const Comparison& c = r.comparisons[0];
    expect_real_evidence(c);
    EXPECT_EQ(c.expectation, "bitexact");
    ASSERT_EQ(c.verdict, Verdict::kFail);
    ASSERT_TRUE(c.first_divergence.has_value());
    const reports::Divergence& d = *c.first_divergence;
    EXPECT_EQ(d.step, p.step);
    EXPECT_EQ(d.layer, p.layer);
    EXPECT_EQ(d.component, p.component);
    EXPECT_NE(d.rerun.find("--stop-after-step " + std::to_string(p.step)), std::string::npos) << d.rerun;
    EXPECT_NE(d.rerun.find(p.spec), std::string::npos) << d.rerun;
    EXPECT_FALSE(d.detail.empty());
    // The failure's two tensors are kept.
    int kept = 0;
    for (const reports::StoredTensor& t : c.tensors) kept += t.step == p.step && t.component == p.component;
    EXPECT_EQ(kept, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Runner, PlantedDefect,
    testing::Values(Planted{"mutant:attn_out:L3:S1", 1, 3, "attn_out"},
                    Planted{"mutant:hc_ffn_comb:L5:S2", 2, 5, "hc_ffn_comb"},
                    Planted{"mutant:topk:L6:S1", 1, 6, "topk"},
                    Planted{"mutant:experts:L0:S3", 3, 0, "experts"},
                    Planted{"mutant:ffn_in:L9:S5", 5, 9, "ffn_in"},
                    Planted{"mutant:cache.compressed_kv:L2:S0", 0, 2, "cache.compressed_kv"},
                    Planted{"mutant:cache.window_kv:L1:S2", 2, 1, "cache.window_kv"},
                    Planted{"mutant:cache.index_keys:L4:S1", 1, 4, "cache.index_keys"},
                    Planted{"mutant:candidates:L6:S1", 1, 6, "candidates"},
                    Planted{"mutant:final_norm_out:L-1:S6", 6, -1, "final_norm_out"}),
    [](const testing::TestParamInfo<Planted>& i) {
      const std::string layer = i.param.layer < 0 ? "m" + std::to_string(-i.param.layer) : std::to_string(i.param.layer);
      std::string n = i.param.component + "_L" + layer + "_S" + std::to_string(i.param.step);
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

// Free-running, a defect spreads to every later component; teacher-forced, only the component
// that carries it differs (its own error), since every later one gets side A's inputs.
TEST(Runner, TeacherForcingConfinesADefectToItsComponent) {
  const Scenario s = small_scenario();
  const Comparison fr = run(s, "ref", "mutant:attn_out:L3:S1", "free-running").comparisons.at(0);
  const Comparison tf = run(s, "ref", "mutant:attn_out:L3:S1", "teacher-forced").comparisons.at(0);
  const auto f_fr = failing_items(fr), f_tf = failing_items(tf);
  EXPECT_GT(f_fr.size(), 10u);
  bool later_step = false;
  for (const auto& [step, layer, comp] : f_fr) later_step = later_step || step > 1;
  EXPECT_TRUE(later_step) << "free-running: the defect reaches later steps through the caches";
  ASSERT_EQ(f_tf.size(), 1u);
  EXPECT_EQ(*f_tf.begin(), std::make_tuple(int64_t{1}, 3, std::string("attn_out")));
}

TEST(Runner, PrecisionAblationIsMeasuredNotAsserted) {
  const ScenarioResult r = run(small_scenario(), "ref", "ref-bf16kv", "free-running");
  const Comparison& c = r.comparisons.at(0);
  expect_real_evidence(c);
  EXPECT_EQ(c.expectation, "measured");
  EXPECT_EQ(c.verdict, Verdict::kMeasured);
  double worst_logit_nmse = 0;
  for (const MetricRow& row : c.rows) {
    if (row.component == "logits" && row.metric == "nmse") worst_logit_nmse = std::max(worst_logit_nmse, row.value);
  }
  EXPECT_GT(worst_logit_nmse, 0.0) << "bf16 caches must change the logits";
  ASSERT_TRUE(c.first_divergence.has_value());
  EXPECT_EQ(c.first_divergence->tolerance.origin, "none");
  // Different cache formats are not byte-compared: a note says so.
  bool noted = false;
  for (const std::string& n : c.notes) noted = noted || n.find("formats differ") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Runner, TolerancePairPassesWithinAndFailsBeyond) {
  // One doubled value in attn_out: within an nmse bound of 1e-2, beyond one of 0.
  const std::string pairs = R"([{"a": "ref", "b": "mutant:attn_out:L3:S1", "expect": "tolerance", "why": "test"}])";
  const auto with_bound = [&](double bound) {
    const std::string rules = R"(, "tolerances": [{"component": "*", "metric": "nmse", "max": )" +
                              std::to_string(bound) + R"(, "origin": "stated", "note": "test"}])";
    RunOptions o;
    o.modes = {"teacher-forced"};
    return run_scenario(small_scenario(pairs, rules), resources(), o).comparisons.at(0);
  };
  const Comparison loose = with_bound(1e-2);
  expect_real_evidence(loose);
  EXPECT_EQ(loose.verdict, Verdict::kPass);
  const Comparison strict = with_bound(0);
  ASSERT_EQ(strict.verdict, Verdict::kFail);
  EXPECT_EQ(strict.first_divergence->component, "attn_out");
  EXPECT_EQ(strict.first_divergence->metric, "nmse");
  EXPECT_EQ(strict.first_divergence->tolerance.origin, "stated");
}

TEST(Runner, DecoderReplayComparesTheReplayedTail) {
  // After a global-only resume, a 90-token prompt whose layers after the candidate source run on
  // the last 64 rows only; the compared outputs of those layers are aligned by tail.
  const Scenario s = parse_scenario(R"({"name": "dec", "seed": 9, "events": [
      {"prompt": [{"random": 70}]}, {"resume": true}, {"prompt": [{"random": 90}]}, {"decode": 2}]})",
                                    "runner_test");
  const ScenarioResult r = run(s, "ref@global", "ref@decoder:64", "teacher-forced");
  const Comparison& c = r.comparisons.at(0);
  expect_real_evidence(c);
  EXPECT_EQ(c.verdict, Verdict::kMeasured) << (c.notes.empty() ? "" : c.notes[0]);
  bool aligned = false;
  for (const std::string& n : c.notes) aligned = aligned || n.find("aligned by tail") != std::string::npos;
  EXPECT_TRUE(aligned);
  // Fewer rows than the window leave holes in the later rings: refused before any work.
  EXPECT_THROW(run(s, "ref@global", "ref@decoder:2", "teacher-forced"), Error);
}

// A planted defect that never applies (its step never comes) proves nothing: inconclusive, never
// a pass; one in a component or layer that does not exist is bad input.
TEST(Runner, ADefectThatNeverFiresIsInconclusive) {
  const Comparison c = run(small_scenario(), "ref", "mutant:attn_out:L3:S99", "free-running").comparisons.at(0);
  expect_real_evidence(c);
  EXPECT_EQ(c.verdict, Verdict::kInconclusive);
  bool noted = false;
  for (const std::string& n : c.notes) noted = noted || n.find("never applied") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_THROW(parse_side("mutant:atten_out:L3:S1"), Error);
  EXPECT_THROW(run(small_scenario(), "ref", "mutant:attn_out:L10:S1", "free-running"), Error);  // 10 layers: 0..9
}

// Two sides on the same replay path run the same computation: bit-exact by default, so a defect
// on a replay path is caught there too.
TEST(Runner, SamePathPairsAreBitExactByDefault) {
  const Comparison c = run(small_scenario(), "ref@global", "mutant:attn_out:L3:S5@global", "free-running").comparisons.at(0);
  EXPECT_EQ(c.expectation, "bitexact");
  ASSERT_EQ(c.verdict, Verdict::kFail);
  EXPECT_EQ(c.first_divergence->step, 5);
  EXPECT_EQ(c.first_divergence->layer, 3);
  EXPECT_EQ(c.first_divergence->component, "attn_out");
}

TEST(Runner, BadInputIsAnErrorNamingIt) {
  EXPECT_THROW(run(small_scenario(), "ref", "nosuch", "free-running"), Error);
  EXPECT_THROW(parse_side("ref@sideways"), Error);
  EXPECT_THROW(parse_side("mutant:attn_out:L3"), Error);
  try {
    parse_scenario(R"({"name": "x", "events": [{"prompt": [{"random": 3}], "chunky": 2}]})", "typo.json");
    FAIL() << "an unknown key must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunky"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("typo.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_scenario(R"({"name": "x", "events": [{"decode": 2}]})", "t"), Error);  // decode before prompt
  // A number beyond double's range is nlohmann's out_of_range, not a parse_error: still a
  // dsv41::Error naming the file (found by fuzz_scenario: the bare input `4e866`).
  for (const char* text : {"4e866", R"({"name": "x", "seed": 1e400})"}) {
    try {
      parse_scenario(text, "huge.json");
      FAIL() << text << ": must be an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scenario 'huge.json': not valid JSON"), std::string::npos) << e.what();
    }
  }
}

TEST(Runner, ToleranceRuleMissingIsAnError) {
  // Without the default rules, a tolerance pair whose rules leave an output uncovered is an error
  // naming it, never a pass; the default rules cover every output.
  const std::string pairs = R"([{"a": "ref", "b": "ref", "expect": "tolerance", "why": "test"}])";
  const std::string only_attn = R"(, "default_tolerances": false, "tolerances": [
      {"component": "attn_out", "metric": "nmse", "max": 0, "origin": "stated", "note": "test"}])";
  RunOptions o;
  o.modes = {"free-running"};
  const Comparison bad = run_scenario(small_scenario(pairs, only_attn), resources(), o).comparisons.at(0);
  EXPECT_EQ(bad.verdict, Verdict::kError);
  bool named = false;
  for (const std::string& n : bad.notes) named = named || n.find("no tolerance rule covers 'embed'") != std::string::npos;
  EXPECT_TRUE(named);
  const Comparison good = run_scenario(small_scenario(pairs), resources(), o).comparisons.at(0);
  expect_real_evidence(good);
  EXPECT_EQ(good.verdict, Verdict::kPass);
}

TEST(Suite, EveryBuiltinScenarioParsesAndDeclaresItsPairs) {
  const std::vector<std::string> names = builtin_scenario_names();
  ASSERT_GE(names.size(), 9u);
  std::set<std::string> kinds;
  for (const std::string& n : names) {
    const Scenario s = builtin_scenario(n);
    EXPECT_EQ(s.name, n);
    EXPECT_FALSE(s.pairs.empty()) << n;
    EXPECT_FALSE(s.description.empty()) << n;
    for (const Pair& p : s.pairs) EXPECT_FALSE(p.why.empty()) << n;
    kinds.insert(s.kind);
    const TokenPlan plan = plan_tokens(s, resources().config.vocab_size);
    int64_t tokens = 0;
    for (const auto& p : plan.prompts) tokens += static_cast<int64_t>(p.size());
    EXPECT_GT(tokens, 0) << n;
  }
  for (const char* k : {"cold_prefill", "cache_hit", "resume", "boundary_facts", "long_retrieval", "concurrent"}) {
    EXPECT_TRUE(kinds.count(k)) << k;
  }
}

TEST(Suite, TokenPlanIsDeterministicAndSeeded) {
  const Scenario s = builtin_scenario("boundary_facts");
  const TokenPlan a = plan_tokens(s, 1024), b = plan_tokens(s, 1024);
  EXPECT_EQ(a.prompts, b.prompts);
  Scenario t = s;
  t.seed += 1;
  EXPECT_NE(plan_tokens(t, 1024).prompts, a.prompts);
  // A span appears verbatim where it is used; a near-duplicate differs in exactly `change` tokens.
  const Scenario lr = builtin_scenario("long_retrieval");
  const TokenPlan p = plan_tokens(lr, 1024);
  const std::vector<int64_t>& needle = p.spans.at("needle");
  const std::vector<int64_t>& prompt = p.prompts.at(0);
  int exact = 0, near = 0;
  for (size_t i = 0; i + needle.size() <= prompt.size(); ++i) {
    int diff = 0;
    for (size_t j = 0; j < needle.size(); ++j) diff += prompt[i + j] != needle[j];
    exact += diff == 0;
    near += diff == 1;
  }
  EXPECT_EQ(exact, 1);
  EXPECT_EQ(near, 8);
}

}  // namespace
}  // namespace dsv41::scenarios::runner
