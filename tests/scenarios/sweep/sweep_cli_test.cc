// `dsv41 sweep` end to end (docs/sweep.md): one process and `mpirun -np 1, 2, 3` give the same
// report content (everything outside /meta/volatile, h5diff), the items spread over the ranks, an
// item equals `dsv41 run` of the same case, an item process killed mid-item is that item's error
// in a valid report, a hung item is killed at --item-timeout, --resume reuses finished items, and
// bad input exits 2. The plan is small (the tiny oracle model, one short scenario, 4 items) so the
// whole file runs in well under a minute on CI's 2 cores.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "reports/report.h"
#include "tests/support/run_cli.h"
#include "tests/support/small_scenario.h"

namespace dsv41::test {
namespace {

// Steps: 0, 1 prefill chunks; 2, 3 decode; 4 resume; 5 prompt; 6 decode (tests/support/small_scenario.h).
const std::string kScenario = small_scenario_json(
    R"("pairs": [{"a": "ref@cold", "b": "ref@full", "expect": "bitexact", "why": "docs/sessions.md"}])");

// 1 scenario x 2 pairs x 2 modes = 4 items, each up to the resume and the step after it.
const std::string kPlan = R"({
  "name": "ci",
  "scenarios": ["small.json"],
  "models": [{"config": "tiny"}],
  "sides": ["ref@cold,ref@full", "ref@cold,ref@global"],
  "modes": ["free-running", "teacher-forced"],
  "stop_after_step": 5
})";

// 2 items (for the resume test).
const std::string kPlan2 = R"({"scenarios": ["small.json"], "models": [{"config": "tiny"}], "stop_after_step": 5,
  "sides": ["ref@cold,ref@full"], "modes": ["free-running", "teacher-forced"]})";

const std::vector<std::string> kItems = {
    "small~tiny~ref@cold,ref@full~free-running", "small~tiny~ref@cold,ref@full~teacher-forced",
    "small~tiny~ref@cold,ref@global~free-running", "small~tiny~ref@cold,ref@global~teacher-forced"};

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string plan() {
  write_file("small.json", kScenario);
  return write_file("plan.json", kPlan);
}

bool have_mpi() {
#if defined(DSV41_MPIEXEC)
  return true;
#else
  return false;
#endif
}

// `mpirun -np N dsv41 <args>` (as root in CI: --allow-run-as-root; 2 cores: --oversubscribe).
CliResult run_mpi(int ranks, const std::string& args) {
#if defined(DSV41_MPIEXEC)
  const std::string out = scratch() + "/stdout", err = scratch() + "/stderr";
  const std::string cmd = std::string("'") + DSV41_MPIEXEC + "' -np " + std::to_string(ranks) +
                          " --oversubscribe --allow-run-as-root '" + DSV41_EXE + "' " + args + " >'" + out + "' 2>'" +
                          err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
#else
  (void)ranks;
  (void)args;
  return {};
#endif
}

bool have_h5diff() { return std::system("command -v h5diff >/dev/null 2>&1") == 0; }

// h5diff of two reports (or of one object in each); true when identical.
bool same_content(const std::string& a, const std::string& b, const std::string& objects = "") {
  const std::string cmd = "h5diff --exclude-path /meta/volatile '" + a + "' '" + b + "' " + objects + " > '" +
                          scratch() + "/diff.txt' 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// The checks every merged report passes: valid schema, the plan's items in plan order, real numbers.
void expect_valid_sweep_report(const std::string& path, size_t ranks, bool every_rank = true) {
  const CliResult check = run_dsv41("report check '" + path + "'");
  EXPECT_EQ(check.code, 0) << check.out << check.err;
  const CliResult show = run_dsv41("report show '" + path + "'");
  EXPECT_EQ(show.code, 0) << show.out << show.err;
  const reports::RunReport r = reports::read_report(path);
  ASSERT_EQ(r.scenarios.size(), kItems.size());
  const std::vector<reports::ItemMeta> items = reports::read_report_items(path);
  ASSERT_EQ(items.size(), kItems.size());
  std::set<int64_t> ranks_used;
  for (size_t i = 0; i < kItems.size(); ++i) {
    EXPECT_EQ(r.scenarios[i].name, kItems[i]);
    EXPECT_EQ(items[i].item, kItems[i]);
    EXPECT_EQ(items[i].model, "tiny");
    EXPECT_GE(items[i].rank, 0);
    EXPECT_LT(items[i].rank, static_cast<int64_t>(ranks));
    EXPECT_FALSE(items[i].host.empty());
    EXPECT_GT(items[i].seconds, 0);
    EXPECT_TRUE(items[i].gpu.empty()) << "a CPU item binds no GPU";
    ranks_used.insert(items[i].rank);
    if (items[i].exit != "ok") continue;
    ASSERT_FALSE(r.scenarios[i].comparisons.empty()) << kItems[i];
    const reports::Comparison& c = r.scenarios[i].comparisons[0];
    ASSERT_FALSE(c.rows.empty()) << kItems[i];
    bool nonzero = false;
    for (const reports::MetricRow& m : c.rows) {
      EXPECT_FALSE(std::isnan(m.value)) << kItems[i] << " " << m.component << " " << m.metric;
      nonzero = nonzero || m.value != 0;
    }
    EXPECT_TRUE(nonzero) << kItems[i] << ": every metric is zero";
  }
  if (every_rank) {
    EXPECT_EQ(ranks_used.size(), ranks) << "every rank ran an item";
  }
}

TEST(SweepCli, OneProcessRunsEveryItemIntoOneValidReportEachItemAsDsv41Run) {
  const std::string p = plan(), out = scratch() + "/one.h5", junit = scratch() + "/one.xml";
  CliResult r = run_dsv41("sweep '" + p + "' -o '" + out + "' --junit '" + junit + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "verdict measured")) << "the global-only pairs are measured: " << r.out;
  EXPECT_TRUE(has(r.err, "1 rank(s) (none (one process))")) << r.err;
  expect_valid_sweep_report(out, 1);
  EXPECT_TRUE(has(read_bytes(junit), "small~tiny~ref@cold,ref@global~teacher-forced"));
  const CliResult list = run_dsv41("sweep '" + p + "' --list");
  EXPECT_EQ(list.code, 0) << list.err;
  for (const std::string& i : kItems) EXPECT_TRUE(has(list.out, i)) << list.out;
  // An item is what `dsv41 run` gives for the same scenario, sides, mode and steps.
  if (!have_h5diff()) GTEST_SKIP() << "h5diff (hdf5-tools) not installed";
  const std::string run = scratch() + "/run.h5";
  r = run_dsv41("run '" + scratch() + "/small.json' --sides ref@cold,ref@global --mode teacher-forced "
                "--stop-after-step 5 -q -o '" + run + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* part : {"comparisons", "steps", "scenario_json"}) {
    EXPECT_TRUE(same_content(run, out, "/scenarios/small/" + std::string(part) + " '/scenarios/" + kItems[3] + "/" + part + "'"))
        << part << ": " << read_bytes(scratch() + "/diff.txt");
  }
}

TEST(SweepCli, OneTwoAndThreeRanksGiveTheSameReportContent) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  if (!have_h5diff()) GTEST_SKIP() << "h5diff (hdf5-tools) not installed";
  const std::string p = plan(), base = scratch() + "/no_mpirun.h5";
  CliResult r = run_dsv41("sweep '" + p + "' -q -o '" + base + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // 1 rank under mpirun (MPI with one rank), 2 ranks with the static split, 3 with the queue.
  for (const auto& [ranks, deal] : std::vector<std::pair<int, std::string>>{{1, "queue"}, {2, "static"}, {3, "queue"}}) {
    const std::string out = scratch() + "/np" + std::to_string(ranks) + ".h5";
    r = run_mpi(ranks, "sweep '" + p + "' -q --deal " + deal + " -o '" + out + "'");
    ASSERT_EQ(r.code, 0) << ranks << " ranks: " << r.out << r.err;
    EXPECT_TRUE(has(r.err, std::to_string(ranks) + " rank(s) (MPI")) << r.err;
    EXPECT_TRUE(has(r.err, "dealing " + deal)) << r.err;
    expect_valid_sweep_report(out, static_cast<size_t>(ranks));
    EXPECT_TRUE(same_content(base, out)) << ranks << " ranks: " << read_bytes(scratch() + "/diff.txt");
  }
  // The check can fail: a report of other content (another token seed) differs.
  const std::string other = scratch() + "/other.h5";
  write_file("plan2.json", R"({"scenarios": ["small.json"], "models": [{"config": "tiny"}], "seeds": [6],
    "sides": ["ref@cold,ref@full"], "modes": ["free-running"], "stop_after_step": 1})");
  r = run_dsv41("sweep '" + scratch() + "/plan2.json' -q -o '" + other + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_FALSE(same_content(base, other));
}

TEST(SweepCli, AnItemProcessKilledMidItemIsThatItemsErrorInAValidReport) {
  const std::string p = plan(), out = scratch() + "/killed.h5";
  const bool mpi = have_mpi();
  const std::string args = "sweep '" + p + "' -q --test-kill-item 1 -o '" + out + "'";
  const CliResult r = mpi ? run_mpi(2, args) : run_dsv41(args);
  ASSERT_EQ(r.code, 2) << "an item's error is the run's error: " << r.out << r.err;
  expect_valid_sweep_report(out, mpi ? 2 : 1);
  const reports::RunReport rep = reports::read_report(out);
  const std::vector<reports::ItemMeta> items = reports::read_report_items(out);
  EXPECT_EQ(rep.verdict, reports::Verdict::kError);
  for (size_t i = 0; i < kItems.size(); ++i) {
    if (i == 1) {
      EXPECT_EQ(rep.scenarios[i].verdict, reports::Verdict::kError);
      EXPECT_TRUE(has(rep.scenarios[i].error, "signal 9")) << rep.scenarios[i].error;
      EXPECT_TRUE(has(rep.scenarios[i].error, "event 1/")) << "its last output, up to the kill: " << rep.scenarios[i].error;
      EXPECT_TRUE(rep.scenarios[i].comparisons.empty());
      EXPECT_TRUE(has(items[i].exit, "signal 9")) << items[i].exit;
    } else {
      EXPECT_NE(rep.scenarios[i].verdict, reports::Verdict::kError) << kItems[i] << ": " << rep.scenarios[i].error;
      EXPECT_FALSE(rep.scenarios[i].comparisons.empty()) << kItems[i];
      EXPECT_EQ(items[i].exit, "ok");
    }
  }
}

TEST(SweepCli, AHungItemIsKilledAtTheTimeout) {
  const std::string p = plan(), out = scratch() + "/timeout.h5";
  const CliResult r = run_dsv41("sweep '" + p + "' -q --item-timeout 0.05 -o '" + out + "'");
  ASSERT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(run_dsv41("report check '" + out + "'").code, 0);
  const std::vector<reports::ItemMeta> items = reports::read_report_items(out);
  ASSERT_EQ(items.size(), kItems.size());
  for (const reports::ItemMeta& m : items) EXPECT_TRUE(has(m.exit, "timeout after 0.05 s")) << m.exit;
  EXPECT_TRUE(has(reports::read_report(out).scenarios[0].error, "timeout after 0.05 s"));
}

TEST(SweepCli, ResumeReusesTheItemsOfAnEarlierRun) {
  if (!have_h5diff()) GTEST_SKIP() << "h5diff (hdf5-tools) not installed";
  plan();
  const std::string p = write_file("plan2.json", kPlan2), work = scratch() + "/work", a = scratch() + "/a.h5",
                    b = scratch() + "/b.h5";
  CliResult r = run_dsv41("sweep '" + p + "' -q --test-kill-item 1 --work-dir '" + work + "' -o '" + a + "'");
  ASSERT_EQ(r.code, 2) << r.out << r.err;
  r = run_dsv41("sweep '" + p + "' --work-dir '" + work + "' --resume -o '" + b + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "(1 resumed from")) << "the killed item runs again, the other does not: " << r.err;
  const std::vector<reports::ItemMeta> items = reports::read_report_items(b);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].exit, "resumed");
  EXPECT_EQ(items[1].exit, "ok");
  const std::string fresh = scratch() + "/fresh.h5";
  ASSERT_EQ(run_dsv41("sweep '" + p + "' -q -o '" + fresh + "'").code, 0);
  EXPECT_TRUE(same_content(fresh, b)) << read_bytes(scratch() + "/diff.txt");
}

// A rank's own process killed (a lost node): Open MPI ends the job and no report is written, but
// the items that arrived are kept in --work-dir, and --resume (here without MPI) runs the rest.
TEST(SweepCli, ARankKilledEndsTheJobAndResumeFinishesTheSweep) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  if (!have_h5diff()) GTEST_SKIP() << "h5diff (hdf5-tools) not installed";
  const std::string p = plan(), work = scratch() + "/work", out = scratch() + "/lost.h5";
  CliResult r = run_mpi(2, "sweep '" + p + "' -q --test-kill-rank 1 --work-dir '" + work + "' -o '" + out + "'");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_FALSE(std::filesystem::exists(out)) << "rank 0 never got to write the report";
  size_t kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(work)) kept += e.path().extension() == ".h5" ? 1 : 0;
  EXPECT_GE(kept, 1u) << "rank 1's first item arrived before it died";
  EXPECT_LT(kept, kItems.size());
  r = run_dsv41("sweep '" + p + "' --work-dir '" + work + "' --resume -o '" + out + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::string resumed = "(";
  resumed += std::to_string(kept);
  resumed += " resumed from";
  EXPECT_TRUE(has(r.err, resumed)) << r.err;
  expect_valid_sweep_report(out, 2, /*every_rank=*/false);
  const std::string fresh = scratch() + "/fresh.h5";
  ASSERT_EQ(run_dsv41("sweep '" + p + "' -q -o '" + fresh + "'").code, 0);
  EXPECT_TRUE(same_content(fresh, out)) << read_bytes(scratch() + "/diff.txt");
}

TEST(SweepCli, BadInputExitsTwoBeforeAnyWork) {
  const std::string bad = write_file("bad.json", R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny", "weight_seed": -1}]})");
  const std::string out = scratch() + "/bad.h5";
  CliResult r = run_dsv41("sweep '" + bad + "' -o '" + out + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "models[0].weight_seed: must be a non-negative integer, got -1")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  r = run_dsv41("sweep '" + plan() + "' -o /no/such/dir/x.h5");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "/no/such/dir")) << r.err;
  r = run_dsv41("sweep '" + plan() + "' --resume -o '" + out + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--resume: needs --work-dir")) << r.err;
  if (have_mpi()) {
    r = run_mpi(2, "sweep '" + bad + "' -o '" + out + "'");
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    size_t count = 0;
    for (size_t at = r.err.find("weight_seed"); at != std::string::npos; at = r.err.find("weight_seed", at + 1)) ++count;
    EXPECT_EQ(count, 1u) << "one message, not one per rank: " << r.err;
  }
}

}  // namespace
}  // namespace dsv41::test
