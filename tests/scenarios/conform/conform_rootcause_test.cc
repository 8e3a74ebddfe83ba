// tests/scenarios/conform/conform_rootcause_test.cc
//
// Independent root causes (docs/conform.md "Root causes"; conform.h root_causes): an early real
// failure does not mask a later independent one, and a failure the port's own wrong cache explains
// is reported as explained, not as a root cause of its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "reference/model/model.h"
#include "reference/seam/ops.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/selftest/bug_zoo.h"

namespace {

namespace fs = std::filesystem;
using dsv41::reports::Verdict;
namespace conform = dsv41::scenarios::conform;
namespace selftest = dsv41::scenarios::selftest;

const selftest::SelftestModel& model() {
  static const selftest::SelftestModel m = selftest::load_selftest_model("", "");
  return m;
}

// The zoo scenario's dump over `ops` (nullptr: the reference) with the mutant `spec` planted.
std::string dump(const std::string& name, const dsv41::reference::seam::Ops* ops, const std::string& spec) {
  const std::string d = testing::TempDir() + "/dsv41_rootcause_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  const dsv41::scenarios::defects::Mutation m = dsv41::scenarios::defects::parse_mutation(spec);
  bool fired = false;
  selftest::DumpDefects defects;
  defects.mutation = &m;
  defects.fired = &fired;
  selftest::write_scenario_dump(d, model().config, model().weights_path, model().weights, selftest::zoo_scenario(),
                                ops ? *ops : dsv41::reference::seam::reference_ops(), "root cause test", defects);
  EXPECT_TRUE(fired) << spec << " did not fire";
  return d;
}

dsv41::reports::RunReport judge(const std::string& dir) {
  return conform::conform(conform::read_port_dump(dir), model().weights,
                          dsv41::reference::model::default_token_map(model().config), conform::ConformOptions{});
}

bool has_root(const std::vector<conform::IndependentRootCause>& v, const std::string& c, int layer, int64_t step) {
  for (const conform::IndependentRootCause& r : v) {
    if (r.cause.component == c && r.cause.layer == layer && r.cause.step == step) return true;
  }
  return false;
}

TEST(ConformRootCauses, ALaterIndependentBugGetsItsOwnRootCause) {
  // Two bugs: the zoo's Engram hash multipliers (wrong from step 0 at every Engram layer) and one
  // attn_out row late in the run.
  const selftest::ZooBug& engram = selftest::zoo_bug("engram_multiplier_off_by_one");
  const auto ops = engram.make_ops(model().config);
  const dsv41::reports::RunReport r = judge(dump("two", ops.get(), "attn_out:L3:S4:x1.05"));
  ASSERT_EQ(r.verdict, Verdict::kFail);
  const std::optional<conform::RootCause> first = conform::root_cause(r);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->component, engram.expected_component);
  const std::vector<conform::IndependentRootCause> all = conform::root_causes(r);
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all.front().cause.component, first->component);
  EXPECT_EQ(all.front().cause.step, first->step);
  EXPECT_FALSE(all.front().also_steps.empty()) << "the Engram bug fails at later steps too: one root cause, its steps";
  EXPECT_TRUE(has_root(all, "attn_out", 3, 4)) << "the later, independent attn_out bug is a root cause of its own";
  int lines = 0;
  for (const std::string& n : r.scenarios.front().comparisons.front().notes) lines += n.rfind("ROOT CAUSE ", 0) == 0;
  EXPECT_EQ(lines, static_cast<int>(all.size()));
}

TEST(ConformRootCauses, AFailureFromThePortsOwnWrongCacheIsExplainedNotARootCause) {
  // One bit of layer 0's newest window entry flips after step 2: the port's later attention reads it.
  const dsv41::reports::RunReport r = judge(dump("cache", nullptr, "cache.window_kv:L0:S2"));
  ASSERT_EQ(r.verdict, Verdict::kFail);
  const std::vector<conform::IndependentRootCause> all = conform::root_causes(r);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().cause.component, "cache.window_kv");
  EXPECT_EQ(all.front().cause.layer, 0);
  EXPECT_EQ(all.front().cause.step, 2);
  for (const conform::IndependentRootCause& c : all) {
    EXPECT_FALSE(c.cause.component == "attn_out" && c.cause.layer == 0)
        << "attn_out@0 read the port's wrong cache: explained, not a root cause (step " << c.cause.step << ")";
  }
  bool explained = false;
  for (const std::string& n : r.scenarios.front().comparisons.front().notes) {
    explained = explained || (n.rfind("EXPLAINED", 0) == 0 && n.find("attn_out") != std::string::npos &&
                              n.find("cache.window_kv") != std::string::npos);
  }
  EXPECT_TRUE(explained) << "the notes say which failure explains it";
}

}  // namespace
