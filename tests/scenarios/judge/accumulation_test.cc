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
