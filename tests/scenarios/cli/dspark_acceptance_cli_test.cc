// dsv41_dspark_acceptance end to end (bench/dspark_acceptance.cc): a small run exits 0, its greedy
// sanity check holds, its JSON holds finite numbers that satisfy the definitions, the same seed
// reproduces it, and bad input is exit 2 naming the input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/run_cli.h"

namespace {

using dsv41::test::CliResult;
using dsv41::test::has;
using dsv41::test::read_bytes;
using dsv41::test::run_dsv41;
using dsv41::test::scratch;
using nlohmann::json;

const std::string kModel = "--config tiny --weights-seeds 0 --prompts 1 --prompt-len 8 --tokens 8 --threads 1 ";
const std::string kSmall = kModel + "--temperature 0,1 --policies fixed:1,fixed:5,threshold:0.5,survival:0.3";

// Every number in `j` is finite (nlohmann writes NaN and infinities as null: count those too).
void count_numbers(const json& j, int64_t& numbers, int64_t& nulls) {
  if (j.is_number()) {
    ++numbers;
    EXPECT_TRUE(std::isfinite(j.get<double>()));
  } else if (j.is_null()) {
    ++nulls;
  } else if (j.is_structured()) {
    for (const json& x : j) count_numbers(x, numbers, nulls);
  }
}

// `j` without its wall-clock fields (the only ones a rerun may change).
json without_times(json j) {
  if (j.is_object()) {
    j.erase("seconds");
    j.erase("seconds_per_round");
    for (auto& [k, v] : j.items()) v = without_times(v);
  } else if (j.is_array()) {
    for (json& v : j) v = without_times(v);
  }
  return j;
}

json run_small(const std::string& name, CliResult& r) {
  const std::string path = scratch() + "/" + name;
  r = run_dsv41(kSmall + " --json '" + path + "'");
  return json::parse(read_bytes(path));
}

TEST(DSparkAcceptanceCli, SmallRunPassesTheGreedyCheckWithFiniteNumbers) {
  CliResult r;
  const json j = run_small("a.json", r);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "PASS")) << r.out;
  EXPECT_TRUE(has(r.out, "seed S = 0")) << "the seed and its derivation are printed";
  EXPECT_TRUE(j["greedy_check"]["passed"].get<bool>());
  EXPECT_EQ(j["greedy_check"]["checked"].get<int64_t>(), 4) << "one prompt x four policies at T = 0";
  ASSERT_EQ(j["runs"].size(), 8u) << "1 weights x 2 temperatures x 4 policies";

  int64_t numbers = 0, nulls = 0;
  count_numbers(j, numbers, nulls);
  EXPECT_GT(numbers, 100);
  const int64_t block = j["block"].get<int64_t>();
  for (const json& run : j["runs"]) {
    const json& s = run["summary"];
    const std::string what = run["weights"].get<std::string>() + " " + run["policy"].get<std::string>();
    for (const char* key : {"mean_k", "mean_m", "tokens_per_target_step", "wasted_rows_per_round"}) {
      ASSERT_TRUE(s[key].is_number()) << what << " " << key;
    }
    ASSERT_TRUE(s["calibration"]["brier"].is_number()) << what;
    ASSERT_TRUE(s["calibration"]["ece"].is_number()) << what;
    // The definitions: tokens per step = m + 1, wasted = k - m, fixed:K verifies min(K, block).
    EXPECT_NEAR(s["tokens_per_target_step"].get<double>(), s["mean_m"].get<double>() + 1, 1e-12) << what;
    EXPECT_NEAR(s["wasted_rows_per_round"].get<double>(), s["mean_k"].get<double>() - s["mean_m"].get<double>(), 1e-12)
        << what;
    if (run["policy"] == "fixed:1") {
      EXPECT_EQ(s["mean_k"].get<double>(), 1.0) << what;
    }
    if (run["policy"] == "fixed:5") {
      EXPECT_EQ(s["mean_k"].get<double>(), static_cast<double>(std::min<int64_t>(5, block))) << what;
    }
    // At T = 0 both distributions are one-hot: the rule's expected acceptance is the realised one.
    if (run["temperature"].get<double>() == 0) {
      EXPECT_EQ(s["acceptance"]["expected"], s["acceptance"]["rate"]) << what;
    }
    EXPECT_EQ(run["generated"].size(), 1u);
    EXPECT_EQ(run["generated"][0].size(), 8u);
  }
}

TEST(DSparkAcceptanceCli, TheSameSeedReproducesTheRun) {
  CliResult r1, r2;
  const json a = run_small("a.json", r1), b = run_small("b.json", r2);
  ASSERT_EQ(r1.code, 0) << r1.err;
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_EQ(without_times(a["runs"]), without_times(b["runs"]));
}

TEST(DSparkAcceptanceCli, ThePlantedAcceptDefectFailsTheGreedyCheck) {
  const CliResult r = run_dsv41(kModel + "--temperature 0 --policies fixed:3 --plant-accept-one-more");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "greedy check FAILED")) << r.err;
  EXPECT_TRUE(has(r.out, "FAIL")) << r.out;
}

TEST(DSparkAcceptanceCli, BadInputIsExit2NamingIt) {
  const CliResult r = run_dsv41("--weights-seeds 0 --policies bogus:3");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "bogus:3")) << r.err;
  const CliResult r2 = run_dsv41("--weights-seeds 0 --prompt-len 500 --tokens 32");
  EXPECT_EQ(r2.code, 2);
  EXPECT_TRUE(has(r2.err, "max_seq_len")) << r2.err;
}

}  // namespace
