// `dsv41 selftest` (scenarios/selftest/selftest.h, docs/selftest.md) on the tiny oracle model: the clean
// reference's zoo-scenario dump passes conform with no alarm; a handful of fast zoo bugs (one per
// kind of implementation: ops, dump transformation, driver) are flagged and located to the
// component, layer and step the zoo table states; the verdicts and exit codes follow the table's
// rule; the verb refuses an unknown bug name. (The whole zoo runs in CTest as Selftest.Ci.)
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "reference/model/model.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/selftest/selftest.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
using dsv41::scenarios::selftest::SelftestOptions;
using dsv41::scenarios::selftest::SelftestResult;
using dsv41::scenarios::selftest::SelftestRow;
using dsv41::test::has;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";

TEST(Selftest, CleanZooDumpPassesConformWithNoAlarm) {
  const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kOracle + "config.json");
  const dsv41::reference::checkpoint::ModelWeights w = dsv41::reference::checkpoint::ModelWeights::load(kOracle + "weights.safetensors", c);
  const std::string dir = testing::TempDir() + "/dsv41_selftest_clean_" + std::to_string(::getpid());
  fs::remove_all(dir);
  dsv41::scenarios::selftest::write_zoo_dump(dir, c, kOracle + "weights.safetensors", w, nullptr);
  const dsv41::scenarios::conform::PortDump d = dsv41::scenarios::conform::read_port_dump(dir);
  const dsv41::scenarios::selftest::ZooScenario& s = dsv41::scenarios::selftest::zoo_scenario();
  ASSERT_EQ(d.steps.size(), s.chunks.size() + s.decode.size());
  EXPECT_EQ(d.steps[static_cast<size_t>(s.resume_step)].event, "resume+decode");
  const dsv41::reports::RunReport r =
      dsv41::scenarios::conform::conform(d, w, dsv41::reference::model::default_token_map(c), dsv41::scenarios::conform::ConformOptions{});
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(r), 0);
  EXPECT_FALSE(dsv41::scenarios::conform::root_cause(r).has_value());
  fs::remove_all(dir);
}

// One bug of each implementation kind, and the format ones the conform fix concerns.
TEST(Selftest, FastBugsAreFlaggedAndLocated) {
  SelftestOptions o;
  o.bugs = {"sink_in_numerator", "swapped_nibbles", "index_keys_block_planar", "engram_multiplier_off_by_one",
            "mhc_pre_not_lagged", "global_only_window_not_rebuilt"};
  o.progress = false;
  std::ostringstream progress;
  const SelftestResult r = dsv41::scenarios::selftest::run_selftest(o, progress);
  ASSERT_EQ(r.rows.size(), o.bugs.size() + 1);
  EXPECT_FALSE(r.error);
  EXPECT_EQ(r.rows[0].bug, "clean");
  EXPECT_EQ(r.rows[0].conform_exit, 0);
  EXPECT_EQ(r.rows[0].verdict, "ok");
  for (size_t i = 0; i < o.bugs.size(); ++i) {
    const SelftestRow& row = r.rows[i + 1];
    const dsv41::scenarios::selftest::ZooBug& bug = dsv41::scenarios::selftest::zoo_bug(o.bugs[i]);
    EXPECT_EQ(row.bug, bug.name);
    EXPECT_TRUE(row.fired) << row.bug << ": the dump equals the clean one";
    EXPECT_TRUE(row.flagged) << row.bug;
    EXPECT_EQ(row.component, bug.expected_component) << row.bug << ": " << row.detail;
    EXPECT_EQ(row.layer, bug.expected_layer) << row.bug;
    EXPECT_EQ(row.step, bug.expected_step) << row.bug;
    EXPECT_EQ(row.verdict, "ok") << row.bug;
  }
  // The layout diagnoses name the storage bug (docs/conform.md, "Caches").
  EXPECT_TRUE(has(r.rows[2].detail, "nibbles swapped")) << r.rows[2].detail;
  EXPECT_TRUE(has(r.rows[3].detail, "block-planar")) << r.rows[3].detail;
  EXPECT_EQ(dsv41::scenarios::selftest::selftest_exit_code(r), 0);
  const std::string table = dsv41::scenarios::selftest::format_selftest_table(r);
  EXPECT_TRUE(has(table, "| swapped_nibbles | ops | yes | yes (exit 1) | cache.compressed_kv | 2 | 0 |")) << table;
}

// The verdict rule and exit codes: a missed or mislocated bug, an alarm on the clean run, an error.
TEST(Selftest, ExitCodeFollowsTheVerdicts) {
  SelftestResult r;
  SelftestRow clean;
  clean.bug = "clean";
  clean.verdict = "ok";
  r.rows.push_back(clean);
  SelftestRow bug;
  bug.bug = "x";
  bug.verdict = "ok";
  r.rows.push_back(bug);
  EXPECT_EQ(dsv41::scenarios::selftest::selftest_exit_code(r), 0);
  for (const char* v : {"MISSED", "MISLOCATED", "NOT-FIRED"}) {
    r.rows[1].verdict = v;
    EXPECT_EQ(dsv41::scenarios::selftest::selftest_exit_code(r), 1) << v;
  }
  r.rows[1].verdict = "ok";
  r.rows[0].verdict = "ALARM";
  EXPECT_EQ(dsv41::scenarios::selftest::selftest_exit_code(r), 1);
  r.error = true;
  EXPECT_EQ(dsv41::scenarios::selftest::selftest_exit_code(r), 2);
}

TEST(Selftest, EveryZooBugHasItsExpectedLocationAndAnImplementation) {
  const std::vector<dsv41::scenarios::selftest::ZooBug>& zoo = dsv41::scenarios::selftest::bug_zoo();
  EXPECT_GE(zoo.size(), 20u);
  int ci = 0;
  for (const dsv41::scenarios::selftest::ZooBug& b : zoo) {
    EXPECT_FALSE(b.description.empty() || b.origin.empty() || b.expected_component.empty()) << b.name;
    const bool implemented = b.kind == dsv41::scenarios::selftest::ZooKind::kOps      ? static_cast<bool>(b.make_ops)
                             : b.kind == dsv41::scenarios::selftest::ZooKind::kDump   ? static_cast<bool>(b.transform_dump)
                                                                            : b.driver_zero_window_at_resume;
    EXPECT_TRUE(implemented) << b.name;
    ci += b.ci;
  }
  EXPECT_GT(ci, 0);
}

TEST(Selftest, CliRefusesAnUnknownBugAndLists) {
  const dsv41::test::CliResult bad = dsv41::test::run_dsv41("selftest --bugs sink_in_numerator,no_such_bug -q");
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
  EXPECT_TRUE(has(bad.err, "no_such_bug")) << bad.err;
  const dsv41::test::CliResult list = dsv41::test::run_dsv41("selftest --list");
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_TRUE(has(list.out, "index_keys_block_planar")) << list.out;
}

}  // namespace
