// scenarios/sweep/sweep_plan.h
//
// A sweep plan (`dsv41 sweep PLAN`, docs/sweep.md): JSON naming scenarios, models (a config with
// its weights or a weight seed), and optionally pairs of sides, modes and token seeds. It expands
// into work items, the cross product scenarios x models x sides x modes x seeds in that nesting
// (models outermost), each one `dsv41 run` of one scenario: one ScenarioResult of the merged report.
//
//   {
//     "name": "ci",
//     "scenarios": ["cold_prefill", "suite", "my_scenario.json"],      // "suite": the built-in suite
//     "models": [{"name": "tiny", "config": "tiny"},                   // tiny: the oracle weights
//                {"name": "small7", "config": "scenarios/configs/small.json", "weight_seed": 7}],
//     "sides": ["ref,ref-bf16kv", "ref@cold,ref@full"],                // optional: one item per pair
//     "modes": ["free-running", "teacher-forced"],                     // optional: one item per mode
//     "seeds": [5, 6],                                                 // optional: one item per token seed
//     "stop_after_step": 3                                             // optional
//   }
//
// Relative paths (scenario files, configs, weights, token maps) are relative to the plan's folder.
// Everything is checked before any work (load_sweep_plan): unknown keys, types, duplicate names,
// configs, scenarios, sides, modes and each item's scenario plan (scenarios/runner/runner.h
// plan_scenario); errors name the file, the field and the reason: "sweep plan 'p.json':
// models[1].weight_seed: must be a non-negative integer, got -3".
//
// An item's name (its group in /scenarios) is "<scenario>~<model>", then "~<A>,<B>" when the plan
// gives sides ('/' in a side written '+'), "~<mode>" when it gives modes, "~seed=<S>" when it
// gives seeds: a function of the plan alone, whatever the ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::sweep {

struct SweepModel {
  std::string name;          // unique in the plan; [A-Za-z0-9_.+-]
  std::string config;        // a preset name or a path (resolved against the plan's folder)
  std::string weights;       // a safetensors path (resolved); "" = generated from weight_seed
  uint64_t weight_seed = 0;  // generated weights (weights == "")
  std::string token_map;     // a file of Engram ids (resolved); "" = the config's default map
  reference::ModelConfig loaded;  // the config, loaded when the plan is checked
  std::string config_hash;        // reference::config_hash(loaded)
  // The model's part of a rerun line: "dsv41 run --config C [--weights W | --weight-seed S] [--token-map M]".
  std::string rerun_prefix() const;
  // What a report records as weights: "file:<name>" or "generated:seed=<n>" (RunMeta::weights).
  std::string weights_label() const;
};

struct SweepItem {
  size_t index = 0;                  // plan order
  std::string name;                  // its group name in the report (above)
  std::string scenario_ref;          // as the plan names it: a built-in name, or a path (resolved)
  size_t model = 0;                  // index into SweepPlan::models
  std::vector<std::string> sides;    // {} (the scenario's pairs) or {A, B}
  std::vector<std::string> modes;    // {} (the scenario's modes) or {mode}
  std::optional<uint64_t> seed;      // the token seed override
  runner::Scenario scenario;                 // loaded (seed applied)
  bool uses_gpu = false;             // a side of one of its pairs is the cuda backend
  int weight_copies = 1;             // weight copies alive at once (the run's, one per backend)
  double estimated_cost = 0;         // docs/sweep.md "Estimated cost"
};

struct SweepPlan {
  std::string source;                // the plan file as given
  std::string name;
  std::vector<std::string> scenarios;
  std::vector<SweepModel> models;
  std::vector<std::vector<std::string>> sides;  // pairs {A, B}; empty: each scenario's own
  std::vector<std::string> modes;
  std::vector<uint64_t> seeds;
  int64_t stop_after_step = -1;
  std::vector<SweepItem> items;      // expanded, in plan order
  bool uses_gpu() const;
};

// Parses, expands and checks a plan (above); `base_dir` resolves relative paths, `source` names the
// plan in errors. Loads configs and scenarios (cheap); never reads weights.
SweepPlan parse_sweep_plan(const std::string& json_text, const std::string& source, const std::string& base_dir);
SweepPlan load_sweep_plan(const std::string& path);

// The relative cost of a scenario run under a model: 2 sides x comparisons x tokens the sides
// process x weight values (a crude FLOP count; it orders the work queue and deals the static split).
double estimate_cost(const runner::Scenario& scenario, size_t comparisons, const reference::ModelConfig& config);

}  // namespace dsv41::scenarios::sweep
