// Sweep plans (scenarios/sweep/sweep_plan.h, docs/sweep.md): the expansion into items and their names,
// relative paths, the cost order, and every bad input refused with the file, the field and the reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "base/error.h"
#include "scenarios/sweep/sweep_plan.h"
#include "tests/support/small_scenario.h"

namespace dsv41::scenarios::sweep {
namespace {

std::string dir() {
  const std::string d = testing::TempDir() + "/dsv41_sweep_plan_" + std::to_string(::getpid());
  std::filesystem::create_directories(d);
  return d;
}

std::string write(const std::string& name, const std::string& text) {
  const std::string p = dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(p).parent_path());
  std::ofstream(p) << text;
  return p;
}

// The error load_sweep_plan throws for `text`, or "" when it throws none.
std::string error_of(const std::string& text) {
  const std::string p = write("bad.json", text);
  try {
    load_sweep_plan(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SweepPlan, ExpandsModelsScenariosSidesModesSeedsInPlanOrder) {
  write("sc/small.json", test::small_scenario_json(R"("pairs": [{"a": "ref", "b": "ref@full", "expect": "bitexact", "why": "x"}])"));
  const std::string good = std::string(R"({"scenarios": ["sc/small.json", "cold_prefill"],
    "models": [{"config": "tiny"}, {"name": "gen3", "config": "tiny", "weight_seed": 3}],
    "sides": ["ref,ref-bf16kv", "ref@cold,ref@full"], "modes": ["teacher-forced"], "seeds": [9]})");
  const SweepPlan plan = load_sweep_plan(write("plan.json", good));
  ASSERT_EQ(plan.items.size(), 2u * 2u * 2u);  // models x scenarios x sides (x 1 mode x 1 seed)
  // Models outermost, then scenarios, sides, modes, seeds; the name rule of docs/sweep.md.
  EXPECT_EQ(plan.items[0].name, "small~tiny~ref,ref-bf16kv~teacher-forced~seed=9");
  EXPECT_EQ(plan.items[1].name, "small~tiny~ref@cold,ref@full~teacher-forced~seed=9");
  EXPECT_EQ(plan.items[2].name, "cold_prefill~tiny~ref,ref-bf16kv~teacher-forced~seed=9");
  EXPECT_EQ(plan.items[4].name, "small~gen3~ref,ref-bf16kv~teacher-forced~seed=9");
  std::set<std::string> names;
  for (const SweepItem& it : plan.items) {
    EXPECT_EQ(it.index, names.size());
    names.insert(it.name);
    EXPECT_EQ(it.scenario.seed, 9u) << "the plan's seed replaces the scenario's";
    EXPECT_GT(it.estimated_cost, 0) << it.name;
    EXPECT_FALSE(it.uses_gpu);
  }
  EXPECT_EQ(names.size(), plan.items.size());
  // The relative scenario path is the plan folder's, and the rerun line names the model.
  EXPECT_EQ(plan.items[0].scenario_ref, (std::filesystem::path(dir()) / "sc/small.json").lexically_normal().string());
  EXPECT_EQ(plan.models[1].rerun_prefix(), "dsv41 run --config tiny --weight-seed 3");
  EXPECT_EQ(plan.models[1].weights_label(), "generated:seed=3");
  // A longer scenario under the same model costs more (cold_prefill's prompt is longer than small's).
  EXPECT_GT(plan.items[2].estimated_cost, plan.items[0].estimated_cost);
}

TEST(SweepPlan, WithoutSidesModesSeedsEachScenarioKeepsItsOwn) {
  const SweepPlan plan = load_sweep_plan(write("own.json", R"({"scenarios": ["suite"], "models": [{"config": "tiny"}]})"));
  ASSERT_EQ(plan.items.size(), runner::builtin_scenario_names().size());
  EXPECT_EQ(plan.items[0].name, runner::builtin_scenario_names()[0] + "~tiny");
  EXPECT_TRUE(plan.items[0].sides.empty());
  EXPECT_TRUE(plan.items[0].modes.empty());
  EXPECT_EQ(plan.items[0].scenario.seed, runner::builtin_scenario(runner::builtin_scenario_names()[0]).seed);
}

TEST(SweepPlan, SlashInASideIsWrittenPlusInTheItemName) {
  const SweepPlan plan = load_sweep_plan(write("plain.json", R"({"scenarios": ["speculative_greedy"],
    "models": [{"config": "tiny"}], "sides": ["ref@cold/plain,ref@cold"]})"));
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].name, "speculative_greedy~tiny~ref@cold+plain,ref@cold");
}

TEST(SweepPlan, BadInputNamesTheFileTheFieldAndTheReason) {
  struct Case {
    std::string json, field, reason;
  };
  const std::vector<Case> cases = {
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "mode": ["x"]})", "unknown key 'mode'", "known:"},
      {R"({"models": [{"config": "tiny"}]})", "missing key 'scenarios'", "built-in"},
      {R"({"scenarios": ["cold_prefill"]})", "missing key 'models'", "config"},
      {R"({"scenarios": [], "models": [{"config": "tiny"}]})", "scenarios", "non-empty array"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}, {"config": "tiny", "weight_seed": -3}]})",
       "models[1].weight_seed", "non-negative integer, got -3"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}, {"config": "tiny"}]})", "models[1]",
       "a second model named 'tiny'"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny", "weights": "w.st", "weight_seed": 1}]})",
       "models[0]", "not both"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny", "weights": "nosuch.safetensors"}]})",
       "models[0].weights", "not a readable file"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "nosuch_preset"}]})", "models[0].config", "nosuch_preset"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny", "name": "a/b"}]})", "models[0].name",
       "only letters"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny", "weigths": "x"}]})", "models[0]",
       "unknown key 'weigths'"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "sides": ["ref"]})", "sides[0]",
       "not one pair of sides A,B"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "sides": ["ref,nosuch"]})", "sides[0]",
       "nosuch"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "modes": ["teacher_forced"]})", "modes[0]",
       "not free-running or teacher-forced"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "seeds": [1.5]})", "seeds[0]",
       "non-negative integer"},
      {R"({"scenarios": ["no_such_scenario"], "models": [{"config": "tiny"}]})", "scenarios", "no_such_scenario"},
      {R"({"scenarios": ["cold_prefill", "cold_prefill"], "models": [{"config": "tiny"}]})", "item 1 (cold_prefill~tiny)",
       "a second item of this name"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "stop_after_step": -1})", "stop_after_step",
       "non-negative integer"},
      {R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}], "seeds": [)", "", "not valid JSON"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(c.json);
    ASSERT_FALSE(e.empty()) << "accepted: " << c.json;
    EXPECT_NE(e.find("sweep plan '" + dir() + "/bad.json'"), std::string::npos) << "names the file: " << e;
    EXPECT_NE(e.find(c.field), std::string::npos) << "names the field '" << c.field << "': " << e;
    EXPECT_NE(e.find(c.reason), std::string::npos) << "says why ('" << c.reason << "'): " << e;
    EXPECT_EQ(e.find(".cc:"), std::string::npos) << "no source path in a user message: " << e;
  }
  // A missing plan file.
  try {
    load_sweep_plan(dir() + "/nosuch.json");
    ADD_FAILURE() << "a missing plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nosuch.json': cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41::scenarios::sweep
