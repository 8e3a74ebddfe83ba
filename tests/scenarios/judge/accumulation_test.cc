// The accumulation an order-variant claim admits (scenarios/judge/derived_bounds.h "Accumulation",
// docs/conform.md "Accumulation: fp8 tensor cores"): the fp8-tensor-core bounds widen exactly the
// chains with an fp8 linear and nothing else; the runner judges a side that runs its fp8 linears on
// tensor cores (the CPU emulation `ref-order:trunc13`) under them and passes it, and still flags a
// 1% row gain planted on it; conform needs the claim for such a dump (fp32 raises an alarm, the
// fp8-tensor-core claim passes), read from the manifest or --accumulation; bad names are refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "reference/model/model.h"
#include "reference/ops/config.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/order_variant.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/runner.h"
#include "scenarios/selftest/calibration.h"
#include "tests/support/runner_fixture.h"
#include "tests/support/seed.h"
#include "tests/support/small_scenario.h"

namespace dsv41::scenarios {
namespace {

namespace fs = std::filesystem;
using judge::Accumulation;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const reference::ModelConfig& config() { return test::oracle_resources().config; }

TEST(Accumulation, NamesRoundTripAndABadNameIsRefusedWithTheValidOnes) {
  EXPECT_EQ(judge::accumulation_from_name("fp32"), Accumulation::kFp32);
  EXPECT_EQ(judge::accumulation_from_name("fp8-tensor-core"), Accumulation::kFp8TensorCore);
  EXPECT_STREQ(judge::name(Accumulation::kFp8TensorCore), "fp8-tensor-core");
  const std::string e = error_of([] { judge::accumulation_from_name("fp8"); });
  EXPECT_TRUE(has(e, "'fp8'") && has(e, "fp32") && has(e, "fp8-tensor-core")) << e;
}

// Every component's tensor-core bound is at least its fp32 one; exactly the chains without an fp8
// linear keep theirs (hc mixes, the norms, the streams, the fp32 head); the ones with one widen.
TEST(Accumulation, TheTensorCoreBoundsWidenExactlyTheChainsWithAnFp8Linear) {
  const std::vector<judge::DerivedBound> a = judge::derived_bound_table(config());
  const std::vector<judge::DerivedBound> b = judge::derived_bound_table(config(), Accumulation::kFp8TensorCore);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].component, b[i].component);
    ASSERT_TRUE(std::isfinite(a[i].bound) && a[i].bound > 0) << a[i].component;
    EXPECT_GE(b[i].bound, a[i].bound) << a[i].component;
    EXPECT_GE(b[i].gain, a[i].gain) << a[i].component;
    const std::string& c = a[i].component;
    const bool fp8 = c == "attn_out" || c == "index_scores" || c == "ffn_out" || c == "engram_out" ||
                     c == "dspark_attn_out" || c == "dspark_ffn_out" || c == "dspark_main_x" || c == "dspark_main_kv";
    if (fp8) {
      EXPECT_GT(b[i].bound, a[i].bound) << c;
      EXPECT_TRUE(has(b[i].origin, "A4")) << b[i].origin;
    } else {
      EXPECT_EQ(b[i].bound, a[i].bound) << c;
      EXPECT_FALSE(has(b[i].origin, "A4")) << b[i].origin;
    }
  }
  // The gain: one fp8 linear (wo_b) not followed by an RMSNorm on attn_out's chain, three on ffn_out's.
  const auto gain = [&](const char* c, Accumulation acc) { return judge::derived_bound(config(), c, acc)->gain; };
  EXPECT_EQ(gain("attn_out", Accumulation::kFp8TensorCore) - gain("attn_out", Accumulation::kFp32), std::ldexp(1.0, -13));
  EXPECT_EQ(gain("ffn_out", Accumulation::kFp8TensorCore) - gain("ffn_out", Accumulation::kFp32), 3 * std::ldexp(1.0, -13));
  // The window cache's chain (wkv -> kv_norm): wider, and a tie band of the top-k wider too.
  EXPECT_GT(judge::derived_cache_bound(config(), "cache.window_kv", Accumulation::kFp8TensorCore)->bound,
            judge::derived_cache_bound(config(), "cache.window_kv")->bound);
  EXPECT_GT(judge::topk_tie_band(config(), Accumulation::kFp8TensorCore), judge::topk_tie_band(config()));
  // index_scores' row statistics: bounded under fp32, measured under fp8-tensor-core (its shared FP4
  // query's frequent flips move whole rows); its max_rowrel stays bounded.
  using K = judge::OrderVariantTolerance;
  EXPECT_EQ(judge::order_variant_tolerance(config(), "index_scores", judge::kRowGainMetric).kind, K::kBound);
  EXPECT_EQ(judge::order_variant_tolerance(config(), "index_scores", judge::kRowGainMetric, nullptr,
                                           Accumulation::kFp8TensorCore).kind,
            K::kMeasured);
  EXPECT_EQ(judge::order_variant_tolerance(config(), "index_scores", judge::kTensorBiasMetric, nullptr,
                                           Accumulation::kFp8TensorCore).kind,
            K::kMeasured);
  EXPECT_EQ(judge::order_variant_tolerance(config(), "index_scores", judge::kRowRelMetric, nullptr,
                                           Accumulation::kFp8TensorCore).kind,
            K::kBound);
  EXPECT_EQ(judge::order_variant_tolerance(config(), "ffn_out", judge::kRowGainMetric, nullptr,
                                           Accumulation::kFp8TensorCore).kind,
            K::kBound);
}

// index_scores under order variance: only rows whose scores decide a selection count (more finite
// scores than index_topk, or more blocks than the candidate pool at the source layer), each against
// the largest |score| of those rows; a step where no row decides anything has no max_rowrel.
TEST(Accumulation, IndexScoresAreJudgedWhereTheyDecideASelectionAgainstTheStepsScale) {
  const float inf = std::numeric_limits<float>::infinity();
  // Rows of 4: row 0 reaches 4 keys, row 1 two (the other two -inf), row 2 three.
  const std::vector<float> a = {1.0f, 0.5f, -0.25f, 0.125f, 0.02f, 0.01f, -inf, -inf, 0.5f, 0.25f, 0.125f, -inf};
  std::vector<float> b = a;
  b[4] = 0.01f;    // row 1: off by 0.01 = half its own max, a hundredth of the step's
  b[9] = 0.375f;   // row 2: off by 0.125
  judge::ScoreSelection s;
  s.topk = 2;  // rows 0 and 2 decide; row 1 (two keys) keeps both whatever the scores
  const std::optional<double> v = judge::index_scores_rowrel(a, b, 4, s, "scores");
  ASSERT_TRUE(v.has_value());
  EXPECT_DOUBLE_EQ(*v, 0.125);  // row 2's 0.125 against the deciding rows' max |a| = 1
  s.topk = 1;  // now row 1 decides too: 0.01 against 1, below row 2's
  EXPECT_DOUBLE_EQ(*judge::index_scores_rowrel(a, b, 4, s, "scores"), 0.125);
  s.topk = 4;  // nothing decides
  EXPECT_FALSE(judge::index_scores_rowrel(a, b, 4, s, "scores").has_value());
  s.pool_blocks = 1;  // the candidate source with a pool of one block of 2: rows 0 and 2 reach 2 blocks
  s.block_size = 2;
  EXPECT_DOUBLE_EQ(*judge::index_scores_rowrel(a, b, 4, s, "scores"), 0.125);
  EXPECT_GT(judge::max_row_relative(a, b, 4, "rows"), 0.49);  // the row's own max would say half
  EXPECT_THROW(judge::index_scores_rowrel(a, std::vector<float>(3), 4, s, "sizes"), Error);
  // The config's selection: index_topk everywhere, the pool only at the candidate source layer.
  const judge::ScoreSelection src = judge::score_selection(config(), config().candidate_source_layer);
  EXPECT_EQ(src.topk, config().index_topk);
  EXPECT_EQ(src.pool_blocks, config().candidate_topk_blocks);
  EXPECT_EQ(judge::score_selection(config(), config().candidate_source_layer + 1).pool_blocks, 0);
  EXPECT_TRUE(has(judge::derived_bound(config(), "index_scores")->origin, "the step's max |ref score|"));
  EXPECT_FALSE(has(judge::derived_bound(config(), "attn_out")->origin, "the step's max"));
}

// A6: under the tensor-core claim, row_gain of a component whose last linear reads a quantizer fed
// by an fp8 linear takes sqrt(row / n_q) more sigmas (ffn_out: dim over moe_inter_dim); a pure 1%
// gain is still far outside, noise that is a linear image of a few sources is not flagged.
TEST(Accumulation, CorrelatedFlipsWidenRowGainsConfidenceOnlyUnderTheTensorCoreClaim) {
  const double widened = judge::kRowGainSigmas * std::sqrt(static_cast<double>(config().dim) / config().moe_inter_dim);
  ASSERT_GT(config().dim, config().moe_inter_dim) << "the tiny config must exercise the factor";
  EXPECT_EQ(judge::row_gain_sigmas(config(), "ffn_out"), judge::kRowGainSigmas);
  EXPECT_DOUBLE_EQ(judge::row_gain_sigmas(config(), "ffn_out", Accumulation::kFp8TensorCore), widened);
  EXPECT_EQ(judge::row_gain_sigmas(config(), "in_stream", Accumulation::kFp8TensorCore), judge::kRowGainSigmas);
  EXPECT_EQ(judge::row_gain_sigmas(config(), "topk", Accumulation::kFp8TensorCore), judge::kRowGainSigmas);
  EXPECT_TRUE(has(judge::row_gain_tolerance(*judge::derived_bound(config(), "ffn_out", Accumulation::kFp8TensorCore)).note,
                  "A6"));
  // A row of 256 values; its error a linear image of 4 sources, one row scaled by 1.01.
  std::mt19937_64 rng(test::seed_for("accumulation/correlated"));
  std::normal_distribution<double> n01;
  const int n = 256, m = 4;
  std::vector<float> a(n), image(n), gain(n);
  std::vector<double> src(m);
  for (double& v : src) v = 0.01 * n01(rng);
  for (int i = 0; i < n; ++i) {
    a[size_t(i)] = static_cast<float>(n01(rng));
    double e = 0;
    for (int k = 0; k < m; ++k) e += n01(rng) * src[size_t(k)];
    image[size_t(i)] = static_cast<float>(a[size_t(i)] + e);
    gain[size_t(i)] = static_cast<float>(1.01 * a[size_t(i)]);
  }
  const double bound = judge::row_gain_tolerance(*judge::derived_bound(config(), "ffn_out", Accumulation::kFp8TensorCore)).bound;
  EXPECT_GT(judge::max_row_gain(a, gain, n, "gain", widened), bound);
  EXPECT_LE(judge::max_row_gain(a, image, n, "image", widened), judge::max_row_gain(a, image, n, "image"));
  EXPECT_THROW(judge::max_row_gain(a, image, n, "sigmas", -1.0), Error);
}

// The scenario where the H100's production `cuda` and `trunc13` raised the two false alarms of
// session 15 (index_scores@2 at a row reaching two keys; one token's ffn_out row at layer 7): passed.
TEST(Accumulation, TheTensorCoreEmulationPassesFullCacheHitTeacherForced) {
  runner::RunOptions o;
  o.sides = {"ref", "ref-order:trunc13"};
  o.modes = {"teacher-forced"};
  const runner::Scenario s = runner::builtin_scenario("full_cache_hit");
  const std::vector<reports::Comparison> c = runner::run_scenario(s, test::oracle_resources(), o).comparisons;
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, reports::Verdict::kPass)
      << (c[0].first_divergence ? c[0].first_divergence->component + "@" + std::to_string(c[0].first_divergence->layer) : "");
  bool scores = false, ffn = false;
  for (const reports::MetricRow& r : c[0].rows) {
    ASSERT_FALSE(std::isnan(r.value)) << r.component << " " << r.metric;
    scores = scores || (r.component == "index_scores" && r.metric == "max_rowrel" && r.value > 0);
    ffn = ffn || (r.component == "ffn_out" && r.metric == "max_rowrel" && r.value > 0);
  }
  EXPECT_TRUE(scores && ffn) << "the emulation moved both: the pass tested them";
}

TEST(Accumulation, BackendsDeclareTheirs) {
  EXPECT_EQ(runner::backend_accumulation("ref-order:trunc13"), Accumulation::kFp8TensorCore);
  EXPECT_EQ(runner::backend_accumulation("ref-order:trunc13:ffn_out:L2:S1:x1.01"), Accumulation::kFp8TensorCore);
  EXPECT_EQ(runner::backend_accumulation("ref-order:splitk"), Accumulation::kFp32);
  EXPECT_EQ(runner::backend_accumulation("ref"), Accumulation::kFp32);
  // cuda, cuda-exact: a build without nvcc refuses the names (backend.h); with it, their accumulation.
  const std::string no_cuda = error_of([] { runner::validate_backend_name("cuda"); });
  if (no_cuda.empty()) {
    EXPECT_EQ(runner::backend_accumulation("cuda"), Accumulation::kFp8TensorCore);
    EXPECT_EQ(runner::backend_accumulation("cuda-exact"), Accumulation::kFp32);
  } else {
    EXPECT_TRUE(has(no_cuda, "no CUDA path")) << no_cuda;
    EXPECT_TRUE(has(error_of([] { runner::backend_accumulation("cuda"); }), "no CUDA path"));
  }
}

// Steps: 0, 1 prefill chunks; 2, 3 decode; 4 resume; 5 prompt; 6 decode.
std::vector<reports::Comparison> run(const std::string& b, const std::string& mode) {
  runner::RunOptions o;
  o.sides = {"ref", b};
  o.modes = {mode};
  const runner::Scenario s = runner::parse_scenario(test::small_scenario_json("\"pairs\": []"), "accumulation_test");
  return runner::run_scenario(s, test::oracle_resources(), o).comparisons;
}

TEST(Accumulation, TheRunnerPassesTheTensorCoreEmulationAndFlagsABugPlantedOnIt) {
  for (const char* mode : {"teacher-forced", "free-running"}) {
    const std::vector<reports::Comparison> c = run("ref-order:trunc13", mode);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_NE(c[0].verdict, reports::Verdict::kFail) << mode;
    EXPECT_NE(c[0].verdict, reports::Verdict::kError) << mode;
    EXPECT_TRUE(has(c[0].expectation_origin, "fp8-tensor-core")) << c[0].expectation_origin;
    bool differs = false;  // the emulation changed something: the pass tested it
    for (const reports::MetricRow& r : c[0].rows) {
      ASSERT_FALSE(std::isnan(r.value)) << r.component << " " << r.metric;
      differs = differs || (r.metric == "max_rowrel" && r.value > 0);
    }
    EXPECT_TRUE(differs) << mode;
  }
  const std::vector<reports::Comparison> bug = run("ref-order:trunc13:ffn_out:L2:S1:x1.01", "teacher-forced");
  ASSERT_EQ(bug.size(), 1u);
  EXPECT_EQ(bug[0].verdict, reports::Verdict::kFail);
  ASSERT_TRUE(bug[0].first_divergence.has_value());
  EXPECT_EQ(bug[0].first_divergence->component, "ffn_out");
  EXPECT_EQ(bug[0].first_divergence->layer, 2);
  EXPECT_EQ(bug[0].first_divergence->step, 1);
}

// A dump written over the emulation: fp32 accumulation raises an alarm (the truncation is outside
// it), fp8-tensor-core passes it, by --accumulation or by the manifest; a bad manifest value is a
// bad dump naming the value.
TEST(Accumulation, ConformNeedsTheClaimForATensorCoreDump) {
  const std::string root = testing::TempDir() + "/dsv41_accumulation_" + std::to_string(::getpid());
  fs::remove_all(root);
  selftest::CalibrationOptions o;
  o.variants = {"trunc13"};
  o.scenarios = {"long_prefill"};
  o.progress = false;
  o.dir = root;
  o.keep = true;
  std::ostringstream progress;
  const selftest::CalibrationResult r = selftest::run_calibration(o, progress);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].verdict, "ok") << r.rows[0].root_cause;
  const std::string dir = root + "/long_prefill.trunc13";
  ASSERT_TRUE(fs::exists(dir + "/" + conform::kPortDumpManifest));
  const runner::BackendResources& res = test::oracle_resources();
  const auto judge_with = [&](const std::string& acc) {
    conform::ConformOptions co;
    co.order_variant = true;
    co.end_to_end = false;
    co.accumulation = acc;
    return conform::conform_exit_code(conform::conform(conform::read_port_dump(dir), res.weights, res.token_map, co));
  };
  EXPECT_EQ(judge_with("fp32"), 1) << "the truncation's flips are outside the fp32 claim";
  EXPECT_EQ(judge_with("fp8-tensor-core"), 0);
  EXPECT_EQ(judge_with(""), 1) << "the manifest says nothing: fp32";
  // The manifest's "accumulation".
  const std::string manifest = dir + "/" + conform::kPortDumpManifest;
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  m["accumulation"] = "fp8-tensor-core";
  std::ofstream(manifest) << m.dump();
  EXPECT_EQ(conform::read_port_dump(dir).accumulation, "fp8-tensor-core");
  EXPECT_EQ(judge_with(""), 0);
  EXPECT_EQ(judge_with("fp32"), 1) << "--accumulation wins over the manifest";
  m["accumulation"] = "tensor";
  std::ofstream(manifest) << m.dump();
  const std::string e = error_of([&] { conform::read_port_dump(dir); });
  EXPECT_TRUE(has(e, "'tensor'") && has(e, "fp8-tensor-core")) << e;
  fs::remove_all(root);
}

}  // namespace
}  // namespace dsv41::scenarios
