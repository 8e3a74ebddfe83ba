// `dsv41 run` end to end: exit codes (0 pass, 1 divergence, 2 bad input, 3 inconclusive), the
// printed rerun line reproduces the failure it names, a failed run never replaces a saved
// report, and `dsv41 report check` accepts what `run` wrote.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_cli.h"
#include "tests/support/small_scenario.h"

namespace dsv41::test {
namespace {

// Steps: 0, 1 prefill chunks; 2, 3 decode; 4 resume; 5 prompt; 6 decode.
const std::string kSmall = small_scenario_json(
    R"("pairs": [{"a": "ref@cold", "b": "ref@full", "expect": "bitexact", "why": "docs/sessions.md"}],
  "modes": ["free-running"])");

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(RunCli, PassingScenarioExitsZeroAndWritesAValidReport) {
  const std::string s = write_file("small.json", kSmall), out = scratch() + "/r.h5", junit = scratch() + "/r.xml";
  const CliResult r = run_dsv41("run '" + s + "' -q -o '" + out + "' --junit '" + junit + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "verdict pass")) << r.out;
  EXPECT_TRUE(has(r.err, "seed 5")) << "every seed is printed: " << r.err;
  EXPECT_TRUE(has(read_bytes(junit), "<testsuite"));
  const CliResult check = run_dsv41("report check '" + out + "'");
  EXPECT_EQ(check.code, 0) << check.out << check.err;
}

TEST(RunCli, PlantedDefectExitsOneAndItsRerunLineReproducesIt) {
  const std::string s = write_file("small.json", kSmall), out = scratch() + "/r.h5";
  const CliResult r = run_dsv41("run '" + s + "' --sides ref,mutant:attn_out:L3:S1 --mode teacher-forced -q -o '" + out + "'");
  ASSERT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "first divergence: step 1 layer 3 component attn_out")) << r.out;
  // The rerun line, run as printed (from the scratch dir, with this build's executable).
  const size_t at = r.out.find("dsv41 run --config");
  ASSERT_NE(at, std::string::npos) << r.out;
  // The command may run over several lines, each but the last ending in " \\" (report show
  // keeps lines within 120 columns): joined, it is one command line.
  std::string line;
  for (size_t from = at;;) {
    const size_t end = r.out.find('\n', from);
    std::string part = r.out.substr(from, end - from);
    const bool more = part.size() >= 2 && part.compare(part.size() - 2, 2, " \\") == 0;
    if (more) part.resize(part.size() - 2);
    if (!line.empty()) line.push_back(' ');
    line.append(part, part.find_first_not_of(' '));
    if (!more || end == std::string::npos) break;
    from = end + 1;
  }
  line = line.substr(std::string("dsv41 ").size());
  const std::string rerun_dir = scratch() + "/rerun";
  std::filesystem::create_directories(rerun_dir);
  const std::string cmd = "cd '" + rerun_dir + "' && '" + std::string(DSV41_EXE) + "' " + line + " -q >out.txt 2>err.txt";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << read_bytes(rerun_dir + "/out.txt") << read_bytes(rerun_dir + "/err.txt");
  const std::string rerun_out = read_bytes(rerun_dir + "/out.txt");
  EXPECT_TRUE(has(rerun_out, "first divergence: step 1 layer 3 component attn_out")) << rerun_out;
  // It stopped after that step, and kept both sides' tensors of the case.
  EXPECT_TRUE(has(rerun_out, " 2 steps")) << rerun_out;
  ASSERT_TRUE(std::filesystem::exists(rerun_dir + "/rerun.h5"));
  EXPECT_EQ(run_dsv41("report check '" + rerun_dir + "/rerun.h5'").code, 0);
}

TEST(RunCli, BadInputExitsTwoNamingIt) {
  const std::string s = write_file("small.json", kSmall);
  CliResult r = run_dsv41("run '" + s + "' --sides ref,nosuch -o '" + scratch() + "/x.h5'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "nosuch")) << r.err;
  r = run_dsv41("run '" + write_file("typo.json", R"({"name": "t", "events": [{"prompt": [1, 2], "chunky": 1}]})") +
                "' -o '" + scratch() + "/x.h5'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "chunky")) << r.err;
  r = run_dsv41("run no_such_scenario -o '" + scratch() + "/x.h5'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "no_such_scenario")) << r.err;
  r = run_dsv41("run '" + s + "' -o /no/such/dir/x.h5");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "/no/such/dir")) << r.err;
  r = run_dsv41("run '" + s + "' --config full -o '" + scratch() + "/x.h5'");  // terabytes of fp32 weights
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "GB of fp32 weights")) << r.err;
  r = run_dsv41("run '" + s + "' --sides ref,ref@decoder:3 -o '" + scratch() + "/x.h5'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "window_size")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(scratch() + "/x.h5"));
}

// A scenario whose session would pass max_seq_len (512) is refused when the files are read,
// before any scenario runs (issue 14: "checks late"): exit 2 naming the scenario, the event and the
// limit, no step run, no report written.
TEST(RunCli, AScenarioPastMaxSeqLenIsRefusedBeforeAnyRuns) {
  const std::string good = write_file("small.json", kSmall), out = scratch() + "/r.h5";
  const std::string long_one = write_file("long.json", R"({"name": "too_long", "seed": 1,
    "events": [{"prompt": [{"random": 300}]}, {"prompt": [{"random": 300}]}],
    "pairs": [{"a": "ref", "b": "ref@full", "expect": "bitexact", "why": "test"}], "modes": ["free-running"]})");
  const CliResult r = run_dsv41("run '" + good + "' '" + long_one + "' -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "too_long")) << r.err;
  EXPECT_TRUE(has(r.err, "max_seq_len")) << r.err;
  EXPECT_FALSE(has(r.err, "dsv41 run: scenario")) << "a scenario ran before the refusal: " << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(RunCli, AFailedRunNeverReplacesASavedReport) {
  const std::string s = write_file("small.json", kSmall), out = scratch() + "/r.h5";
  ASSERT_EQ(run_dsv41("run '" + s + "' -q -o '" + out + "'").code, 0);
  const std::string before = read_bytes(out);
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(run_dsv41("run '" + s + "' --sides ref,bogus -q -o '" + out + "'").code, 2);
  EXPECT_EQ(read_bytes(out), before);
}

// Two runs of the same command give the same report, apart from /meta/volatile.
TEST(RunCli, TwoRunsDifferOnlyInVolatileMetadata) {
  if (std::system("command -v h5diff >/dev/null 2>&1") != 0) GTEST_SKIP() << "h5diff (hdf5-tools) not installed";
  const std::string s = write_file("small.json", kSmall), a = scratch() + "/a.h5", b = scratch() + "/b.h5";
  ASSERT_EQ(run_dsv41("run '" + s + "' --sides ref,ref-bf16kv -q -o '" + a + "'").code, 0);
  ASSERT_EQ(run_dsv41("run '" + s + "' --sides ref,ref-bf16kv -q -o '" + b + "'").code, 0);
  const std::string cmd = "h5diff --exclude-path /meta/volatile '" + a + "' '" + b + "' > '" + scratch() + "/d.txt' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_bytes(scratch() + "/d.txt");
  const std::string all = "h5diff '" + a + "' '" + b + "' > /dev/null 2>&1";
  EXPECT_NE(std::system(all.c_str()), 0) << "the volatile metadata (times) must differ: the comparison above is not vacuous";
}

TEST(RunCli, MissingEvidenceIsInconclusiveNotAPass) {
  // A probe step with no resume boundary before it: recall by distance cannot be measured.
  const std::string s = write_file("probe.json", R"({
    "name": "probe_without_boundary", "seed": 3,
    "events": [{"prompt": [{"random": 40}]}, {"prompt": [{"random": 4}], "probe": true}],
    "pairs": [{"a": "ref", "b": "ref@full", "expect": "bitexact", "why": "test"}],
    "modes": ["free-running"]})");
  const CliResult r = run_dsv41("run '" + s + "' -q -o '" + scratch() + "/p.h5'");
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "inconclusive")) << r.out;
}

// DSV41_REF_OP_TIMES=1 (docs/scale.md): the reference prints its ops by total wall time at exit;
// without it, nothing.
TEST(RunCli, RefOpTimesListTheReferenceOpsOnlyWhenAsked) {
  const std::string s = write_file("small.json", kSmall), out = scratch() + "/times.h5";
  const CliResult plain = run_dsv41("run '" + s + "' -q -o '" + out + "'");
  ::setenv("DSV41_REF_OP_TIMES", "1", 1);
  const CliResult timed = run_dsv41("run '" + s + "' -q -o '" + out + "'");
  ::unsetenv("DSV41_REF_OP_TIMES");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(timed.code, 0) << timed.err;
  EXPECT_FALSE(has(plain.err, "reference op times")) << plain.err;
  EXPECT_TRUE(has(timed.err, "reference op times (DSV41_REF_OP_TIMES, every thread)")) << timed.err;
  for (const char* op : {"linear", "sparse_attn", "index_scores", "index_topk", "moe_experts", "hc_post"}) {
    EXPECT_TRUE(has(timed.err, std::string("\n  ") + op + " ")) << op << " missing from:\n" << timed.err;
  }
}

TEST(RunCli, ListNamesTheSuiteAndBackends) {
  const CliResult r = run_dsv41("run --list");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* n : {"cold_prefill", "full_cache_hit", "boundary_facts", "concurrent_sessions", "ref-bf16kv", "mutant:"}) {
    EXPECT_TRUE(has(r.out, n)) << n;
  }
}

TEST(RunCli, BadReplaySpecsExitTwoWithAClearMessage) {
  const std::string s = write_file("small.json", kSmall), out = scratch() + "/replay.h5";
  // A free-running replay (the scenario's mode), a negative count, a seed with nothing to replay.
  CliResult r = run_dsv41("run '" + s + "' --replay 2 -q -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "teacher-forced steps only")) << r.err;
  r = run_dsv41("run '" + s + "' --replay -1 --mode teacher-forced -q -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  r = run_dsv41("run '" + s + "' --replay-seed 5 --mode teacher-forced -q -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "no pair that replays")) << r.err;
  const std::string bad = write_file(
      "bad_replay.json", small_scenario_json(R"("pairs": [{"a": "ref", "b": "ref", "expect": "bitexact", "why": "w",
      "replay": {"extra": 1, "every": 2}}], "modes": ["teacher-forced"])"));
  r = run_dsv41("run '" + bad + "' -q -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "replay")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace dsv41::test
