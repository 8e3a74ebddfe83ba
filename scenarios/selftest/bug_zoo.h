// scenarios/selftest/bug_zoo.h
//
// The bug zoo of `dsv41 selftest` (docs/selftest.md): realistic port bugs, each planted in the
// reference so that the verifier (`dsv41 conform`) can be shown to flag it and to locate it. Each
// bug is one of:
//   ops      a variant of one op behind the ops seam (reference/seam/ops.h): a ForwardingOps
//            (scenarios/defects/bug_zoo_forwarding.h) that overrides that op and forwards the rest;
//   dump     a transformation of the written dump (the bug is in storage: the bytes a port's
//            cache holds, e.g. swapped nibbles, a block-planar layout);
//   driver   a defect in the orchestration that no op sees (the selftest scenario's resume),
//            applied by the scenario driver at the step it concerns.
// Every bug names where conform must locate it: the root-cause component (reference/model/hooks.h name or
// "cache.<kind>"), layer (-1: model.*) and step of the selftest scenario (zoo_scenario()).
//
// Example:
//   for (const ZooBug& b : bug_zoo()) {
//     std::unique_ptr<reference::seam::Ops> ops = b.make_ops ? b.make_ops(config) : nullptr;   // else the reference
//     write_zoo_dump(dir, config, weights_path, b);
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/seam/ops.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/defects/bug_zoo_ops.h"
#include "scenarios/defects/mutants.h"

namespace dsv41::scenarios::selftest {

enum class ZooKind { kOps, kDump, kDriver };
const char* name(ZooKind k);

struct ZooBug {
  std::string name;         // "sink_in_numerator": what --bugs takes
  std::string description;  // one line
  std::string origin;       // "ports.md §2.5 (vllm#40991)" or "format pitfall (docs/formats.md)"
  ZooKind kind = ZooKind::kOps;
  // Where conform must locate it in zoo_scenario().
  std::string expected_component;
  int expected_layer = -1;
  int64_t expected_step = 0;
  bool ci = false;  // in the `--ci` subset
  // kOps: the buggy ops (forwarding all but one op to the reference).
  std::function<std::unique_ptr<reference::seam::Ops>(const reference::ModelConfig&)> make_ops;
  // kDump: rewrites the dump directory in place (after it was written).
  std::function<void(const std::string& dir, const reference::ModelConfig&)> transform_dump;
  // kDriver: the step at which the driver plants the defect (see ZooScenario::resume_step).
  bool driver_zero_window_at_resume = false;
};

// The selftest scenario, in which every zoo bug fires: `prompt` in chunks (the odd first chunk
// splits a ratio-2 compressor group; the 64-slot window wraps), then `decode` one token each; the
// step `resume_step` is a full resume (event "resume+decode", bit-exact: a continuation).
struct ZooScenario {
  std::vector<int64_t> prompt;
  std::vector<int64_t> chunks;  // sizes, summing to prompt.size()
  std::vector<int64_t> decode;
  int64_t resume_step = 0;      // index of the resumed step (a decode step)
};
const ZooScenario& zoo_scenario();

// Every bug, in a fixed order.
const std::vector<ZooBug>& bug_zoo();
// The bug named `name`; a dsv41::Error listing the names otherwise.
const ZooBug& zoo_bug(const std::string& name);

// golden/oracle/<file> of the source tree (the built-in tiny oracle's config and weights).
std::string builtin_oracle_file(const std::string& file);
// A model's config and weights from these paths ("": the built-in tiny oracle's), as every
// self-test run loads them.
struct SelftestModel {
  std::string weights_path;
  reference::ModelConfig config;
  reference::checkpoint::ModelWeights weights;
};
SelftestModel load_selftest_model(const std::string& config_path, const std::string& weights_path);
// "component@layer step S": how the self-test's tables name a location.
std::string zoo_location(const std::string& component, int layer, int64_t step);
// Whether any tensor of any step differs between two dumps (directories) of the same scenario.
bool dumps_differ(const std::string& a, const std::string& b);

// What a dump's driver plants besides its ops (DumpDefects{}: nothing).
struct DumpDefects {
  const defects::Mutation* mutation = nullptr;  // a planted value (scenarios/defects/mutants.h), or nullptr
  bool* fired = nullptr;                        // set when the mutation applied (may be nullptr)
  bool zero_window_at_resume = false;           // the driver bug global_only_window_not_rebuilt
};

// Writes the port dump of scenario `s` to `dir` (new or empty) through the code path of
// `dsv41 forward --dump` (capture_hooks, PortDumpWriter), the model running over `ops`; producer:
// the manifest's producer line.
void write_scenario_dump(const std::string& dir, const reference::ModelConfig& config, const std::string& weights_path,
                         const reference::checkpoint::ModelWeights& weights, const ZooScenario& s,
                         const reference::seam::Ops& ops, const std::string& producer, const DumpDefects& defects = {});

// Writes the port dump of zoo_scenario() to `dir` (new or empty) through the code path of
// `dsv41 forward --dump` (capture_hooks, PortDumpWriter), with the bug planted (nullptr: the clean
// reference). token_map: the default map of the config.
void write_zoo_dump(const std::string& dir, const reference::ModelConfig& config, const std::string& weights_path,
                    const reference::checkpoint::ModelWeights& weights, const ZooBug* bug);

}  // namespace dsv41::scenarios::selftest
