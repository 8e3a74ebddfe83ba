// scenarios/runner/runner.h
//
// Runs a scenario: for each pair of sides and each comparison mode, both sides replay the
// scenario's events in lockstep (side A's step, then side B's same step), every step's captures
// are compared item by item (scenarios/runner/compare.h), and the result is a reports::ScenarioResult
// with every metric row, the verdict and the first divergence with a command that reruns it.
//
//   free-running    each side runs on its own outputs: the error a side accumulates
//   teacher-forced  side B records each component's own output, then continues with side A's
//                   value of it (every hooked output: layer streams, mHC mixes, attention and FFN
//                   inputs/outputs, top-k, candidate mask, experts, final norm): each comparison
//                   measures that component's own error given identical inputs. B's caches are
//                   still its own (written from the forced inputs).
// Both sides always consume the same tokens (decode tokens are side A's argmax).
// The verdicts come from scenarios/runner/verdict.h, the tensors a report keeps from scenarios/runner/keep.h.
//
// Example:
//   RunOptions o;
//   reports::ScenarioResult r = run_scenario(load_scenario("cold_prefill"), resources, o);
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "reports/report.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/keep.h"
#include "scenarios/runner/replay_plan.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

// Where a run is, for a progress display (scenarios/runner/progress.h): given at the start of each event
// and of each step of each comparison.
struct RunPosition {
  std::string scenario, pair, mode;        // pair: "a vs b"
  size_t comparison = 0, comparisons = 1;  // this comparison (0-based) of the scenario's
  size_t event = 0, events = 1;            // this event (0-based) of the scenario's
  int64_t step = 0;                        // the scenario's step that runs now
  std::string phase;                       // "prefill", "decode", "resume", "round"; "" at an event's start
};

struct RunOptions {
  std::vector<std::string> sides;   // "A,B" given: this one pair replaces the scenario's pairs
  std::vector<std::string> modes;   // given: replaces the scenario's modes
  int64_t stop_after_step = -1;     // >= 0: stop after this step
  std::optional<Focus> save_tensors;  // keep these tensors (both sides; scenarios/runner/keep.h)
  bool save_failure_tensors = true;   // keep the first divergence's tensors
  // The command prefix a rerun line starts with (e.g. "dsv41 run --config tiny --weights W").
  std::string rerun_prefix = "dsv41 run";
  std::function<void(const std::string&)> progress;  // one line per event (may be empty)
  std::function<void(const RunPosition&)> on_progress;  // at each event and step (may be empty)
  // Print each comparison's wall time per side on stderr (`dsv41 run --time-sides`): making the
  // side's backends, and its steps. Never in the report (wall times are volatile).
  bool time_sides = false;
  // Sampled replay (docs/scale.md) for every pair: extra steps beyond the required ones, and the
  // draw's seed (each overrides a pair's "replay"; a seed alone needs a pair that replays).
  std::optional<int64_t> replay_extra;
  std::optional<uint64_t> replay_seed;
  // Sampled replay: side B's steps run on a worker thread beside side A's (false: after each of
  // A's, on this thread). The report is the same either way; only the wall time differs.
  bool replay_beside_a = true;
};

// What a scenario will run, checked before any work: its pairs (--sides replaces them), modes,
// tolerance rules (every metric name and component pattern must exist: a typo is an error, never
// a rule that silently matches nothing), decoder-replay rows, and its tokens. A dsv41::Error names
// the scenario and what is wrong.
struct ScenarioPlan {
  std::vector<Pair> pairs;
  std::vector<std::string> modes;
  std::vector<judge::ToleranceRule> rules;           // the scenario's rules, then the default rules
  std::vector<judge::ToleranceRule> explicit_rules;  // the scenario's own rules (an order-variant pair's)
  TokenPlan tokens;
  int sessions = 0;
  std::vector<std::optional<ReplaySample>> replay;  // [pair] the steps side B replays (none: every step)
  // The largest indexer score matrix one step materializes ([T, reachable keys] fp32 of the index
  // layer with the smallest ratio; docs/scale.md), in bytes, and the step: what a run checks
  // against the machine's memory before any work (sizes are validated before allocating: docs/errors.md).
  int64_t largest_scores_bytes = 0;
  int64_t largest_scores_step = -1;
};
ScenarioPlan plan_scenario(const Scenario& scenario, const reference::ModelConfig& config, const RunOptions& options);

reports::ScenarioResult run_scenario(const Scenario& scenario, const BackendResources& resources,
                                     const RunOptions& options);

// A result naming the scenario (name, kind, description, source, JSON, seed) and nothing else:
// what run_scenario fills in, and what a caller records when the scenario cannot run.
reports::ScenarioResult scenario_result_header(const Scenario& scenario);

// A word a POSIX shell reads back as itself (reports/report.h).
using reports::shell_quote;

}  // namespace dsv41::scenarios::runner
