// The small-bug zoo of `dsv41 selftest --small-bugs` (scenarios/selftest/small_zoo.h,
// scenarios/defects/small_bug_ops.h, docs/selftest.md "Small bugs"): every entry is complete and
// names a component it can be located at; every entry's bug changes the zoo scenario's dump (a bug
// that changes nothing tests nothing); one CI bug is flagged and located through the runner; the
// exit-code rule; an unknown name is an error.
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>

#include <gtest/gtest.h>

#include "base/error.h"
#include "reference/model/hooks.h"
#include "reference/seam/ops.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/selftest/small_zoo.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::scenarios::selftest;

TEST(SmallZoo, EveryEntryIsCompleteAndNamesALocatableComponent) {
  const st::SelftestModel m = st::load_selftest_model("", "");
  const std::vector<st::SmallBug>& z = st::small_zoo();
  EXPECT_GE(z.size(), 15u);  // issue 31: at least 15 small bugs
  std::set<std::string> names;
  int ci = 0;
  for (const st::SmallBug& b : z) {
    SCOPED_TRACE(b.name);
    EXPECT_TRUE(names.insert(b.name).second) << "duplicate name";
    EXPECT_FALSE(b.description.empty());
    EXPECT_FALSE(b.origin.empty());
    EXPECT_FALSE(b.how.empty());
    EXPECT_NE(b.make_ops != nullptr, !b.mutation.empty()) << "exactly one of ops and mutant";
    if (!b.mutation.empty()) {
      EXPECT_NO_THROW(dsv41::scenarios::defects::parse_mutation(b.mutation));
    }
    EXPECT_TRUE(dsv41::reference::model::component_from_name(b.expected_component).has_value());
    EXPECT_GE(b.expected_layer, -1);
    EXPECT_LT(b.expected_layer, m.config.n_layers);
    EXPECT_GE(b.expected_step, 0);
    EXPECT_LT(b.expected_step, 5);  // the zoo scenario's 5 steps
    ci += b.ci;
    EXPECT_EQ(&st::small_bug(b.name), &b);
  }
  EXPECT_GT(ci, 0);
  EXPECT_THROW(st::small_bug("no_such_bug"), dsv41::Error);
}

// Each entry's bug changes the dump of the zoo scenario (and a mutant reports that it applied).
TEST(SmallZoo, EveryEntrysBugChangesTheDump) {
  const st::SelftestModel m = st::load_selftest_model("", "");
  const std::string root = (fs::temp_directory_path() / ("dsv41_small_zoo_test_" + std::to_string(::getpid()))).string();
  fs::remove_all(root);
  const std::string clean = root + "/clean";
  st::write_scenario_dump(clean, m.config, m.weights_path, m.weights, st::zoo_scenario(),
                          dsv41::reference::seam::reference_ops(), "small_zoo_test (clean)");
  ASSERT_TRUE(fs::exists(clean + "/" + dsv41::scenarios::conform::dump_step_file(4)));  // 5 steps written
  for (const st::SmallBug& b : st::small_zoo()) {
    SCOPED_TRACE(b.name);
    const std::string dir = root + "/" + b.name;
    std::unique_ptr<dsv41::reference::seam::Ops> ops =
        b.make_ops ? b.make_ops(m.config, dsv41::reference::seam::reference_ops()) : nullptr;
    std::optional<dsv41::scenarios::defects::Mutation> mutation;
    if (!b.mutation.empty()) mutation = dsv41::scenarios::defects::parse_mutation(b.mutation);
    bool fired = false;
    st::DumpDefects d;
    d.mutation = mutation ? &*mutation : nullptr;
    d.fired = &fired;
    st::write_scenario_dump(dir, m.config, m.weights_path, m.weights, st::zoo_scenario(),
                            ops ? *ops : dsv41::reference::seam::reference_ops(), "small_zoo_test " + b.name, d);
    if (mutation) {
      EXPECT_TRUE(fired) << "the mutant did not apply";
    }
    EXPECT_TRUE(st::dumps_differ(clean, dir)) << "the bug changed nothing in the dump";
    fs::remove_all(dir);
  }
  EXPECT_FALSE(st::dumps_differ(clean, clean));  // the comparison can say "no"
  fs::remove_all(root);
}

// A CI bug through the runner: the clean run passes, the bug fires and is located where planted.
TEST(SmallZoo, ACiBugIsFlaggedAndLocatedWherePlanted) {
  const st::SmallBug* bug = nullptr;
  for (const st::SmallBug& b : st::small_zoo()) {
    if (b.ci && bug == nullptr) bug = &b;
  }
  ASSERT_NE(bug, nullptr);
  st::SmallZooOptions o;
  o.bugs = {bug->name};
  o.progress = false;
  std::ostringstream progress;
  const st::SmallZooResult r = st::run_small_zoo(o, progress);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].bug, "clean");
  EXPECT_EQ(r.rows[0].verdict, "ok") << r.rows[0].located_at;
  const st::SmallZooRow& row = r.rows[1];
  EXPECT_TRUE(row.fired);
  EXPECT_TRUE(row.flagged);
  EXPECT_TRUE(row.located) << row.located_at << " (expected " << row.expected << ")";
  EXPECT_EQ(row.verdict, "ok");
  EXPECT_FALSE(row.at_planted.empty());  // a checked row at the planted component, failed
  EXPECT_EQ(st::small_zoo_exit_code(r, 1.0), 0);
  const std::string table = st::format_small_zoo_table(r);
  EXPECT_NE(table.find("| " + bug->name + " |"), std::string::npos) << table;
  EXPECT_NE(table.find("located 1 of 1"), std::string::npos) << table;
}

// The bugs planted in another backend (--base): the tensor-core emulation ref-order:trunc13, judged
// under its own accumulation (fp8-tensor-core): its clean run passes, a bug of an op recomputed on
// the host (the shared expert x1.01, its linears on the emulation's block dot) and one that edits
// the base's output (one index-key code) are flagged and located where planted; a base with a
// planted defect is refused.
TEST(SmallZoo, BugsPlantedInTheTensorCoreEmulationAreLocated) {
  st::SmallZooOptions o;
  o.bugs = {"shared_expert_1pct", "index_keys_code_nibble"};
  o.base = "ref-order:trunc13";
  o.progress = false;
  std::ostringstream progress;
  const st::SmallZooResult r = st::run_small_zoo(o, progress);
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.rows[0].verdict, "ok") << r.rows[0].located_at << " " << r.rows[0].detail;
  for (size_t i = 1; i < r.rows.size(); ++i) {
    const st::SmallZooRow& row = r.rows[i];
    SCOPED_TRACE(row.bug);
    EXPECT_TRUE(row.fired);
    EXPECT_TRUE(row.located) << row.located_at << " (expected " << row.expected << ")";
    EXPECT_EQ(row.verdict, "ok");
  }
  o.base = "ref-order:trunc13:ffn_out:L2:S1:x1.01";
  o.bugs = {"shared_expert_1pct"};
  try {
    st::run_small_zoo(o, progress);
    ADD_FAILURE() << "a base with a planted defect was accepted";
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a base"), std::string::npos) << e.what();
  }
}

TEST(SmallZoo, ExitCodeRule) {
  st::SmallZooResult r;
  st::SmallZooRow clean;
  clean.bug = "clean";
  clean.verdict = "ok";
  r.rows.push_back(clean);
  for (int i = 0; i < 19; ++i) {
    st::SmallZooRow row;
    row.bug = "b" + std::to_string(i);
    row.verdict = "ok";
    r.rows.push_back(row);
  }
  st::SmallZooRow missed;
  missed.bug = "missed";
  missed.verdict = "MISSED";
  r.rows.push_back(missed);
  EXPECT_DOUBLE_EQ(st::small_zoo_located_fraction(r), 0.95);
  EXPECT_EQ(st::small_zoo_exit_code(r, 0.95), 0);
  EXPECT_EQ(st::small_zoo_exit_code(r, 1.0), 1);
  r.rows.back().verdict = "NOT-FIRED";  // a bug that changes nothing fails the run
  EXPECT_EQ(st::small_zoo_exit_code(r, 0.5), 1);
  r.rows.back().verdict = "MISSED";
  r.rows.front().verdict = "ALARM";  // a false alarm on the clean reference fails the run
  EXPECT_EQ(st::small_zoo_exit_code(r, 0.5), 1);
  r.error = true;
  EXPECT_EQ(st::small_zoo_exit_code(r, 0.5), 2);
}

}  // namespace
