// Agreement of the whole reference forward with the official code on golden/oracle (the tiny
// config, the oracle weights and tokens), through the same code `dsv41 agree` runs
// (scenarios/agree/agree.h): nothing here knows the run's shape; steps, layers and roles come from the
// data and the config. docs/agreement.md gives every bound and its origin.
//
// 1. Teacher-forced against the default run (torch's tie order): every layer gets the official
//    input stream, pre and selections; each layer output, the logits, the caches and the
//    compressor state within their bounds; the reference's own top-k tie-equivalent.
// 2. Free-running against the tie-rule run (tie_lowest_index.h5): measured and printed, with
//    regression bounds (docs/agreement.md explains why selections flip).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "scenarios/agree/agree.h"

namespace dsv41::scenarios::agree {
namespace {

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle";

// Free-running: a selection that sits at a near-tie (index scores are bf16, expert scores fp32)
// flips on a 1-ulp upstream difference and changes everything after it, so this is a measurement
// with regression bounds: measured NMSE <= 0.084 per step and the argmax equal at 7 of 9 steps.
constexpr double kFreeRunMaxNmse = 0.2;
constexpr int kFreeRunMinArgmaxAgree = 6;

TEST(TeacherForced, EveryLayerOfPrefillAndDecodeMatchesTheOfficialRun) {
  const OracleRun run = OracleRun::open(kOracle);
  const reports::Comparison c = agree_run(run, AgreeOptions{}).at(0).comparisons.at(0);
  int64_t streams = 0, caches = 0;
  for (const reports::MetricRow& r : c.rows) {
    if (r.component == "out_stream" && r.metric == "nmse") {
      std::printf("step %lld layer %02d out_stream nmse %.2e\n", static_cast<long long>(r.step), r.layer, r.value);
      ++streams;
    }
    caches += r.component.rfind("cache.", 0) == 0;
    if (r.verdict == reports::Verdict::kFail) ADD_FAILURE() << r.component << " " << r.metric << " = " << r.value;
  }
  EXPECT_EQ(streams, static_cast<int64_t>(run.steps().size()) * run.config().n_layers);
  EXPECT_EQ(caches, run.config().n_layers + 2 * static_cast<int64_t>(run.config().kv_source_layers.size()));
  EXPECT_EQ(c.verdict, reports::Verdict::kPass);
}

TEST(FreeRunning, LogitsAgainstTheTieRuleRun) {
  AgreeOptions o;
  o.teacher_forced = false;
  o.free_running = true;
  const OracleRun run = OracleRun::open(kOracle);
  const reports::Comparison c = agree_run(run, o).at(0).comparisons.at(0);
  int agree = 0, steps = 0;
  for (const reports::MetricRow& r : c.rows) {
    if (r.component != "logits") continue;
    if (r.metric == "nmse") {
      std::printf("free-running step %lld: logits nmse %.3g\n", static_cast<long long>(r.step), r.value);
      EXPECT_LE(r.value, kFreeRunMaxNmse) << "step " << r.step;
      ++steps;
    }
    if (r.metric == "top1_agree") agree += r.value > 0 ? 1 : 0;
  }
  EXPECT_EQ(steps, static_cast<int>(run.steps().size()));
  EXPECT_GE(agree, kFreeRunMinArgmaxAgree);
}

}  // namespace
}  // namespace dsv41::scenarios::agree
