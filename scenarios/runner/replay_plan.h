// scenarios/runner/replay_plan.h
//
// Sampled teacher-forced replay (docs/scale.md): which steps of a scenario side B replays when a
// pair carries "replay" (scenarios/runner/scenario.h ReplaySpec). The steps of a scenario are known before
// it runs (a prompt event of n tokens in chunks of c is ceil(n / c) steps, a decode event of n is
// n steps, a speculate event of n rounds is n steps, a resume is one step), so the sample is a
// deterministic function of the scenario, the token plan and the replay seed:
//   required  the first and the last chunk of every prompt event; every resume step and the next
//             step of its session (the resumption's first step); the first step of every decode
//             and every speculate event
//   drawn     `extra` further steps, distinct, drawn from the rest with SplitMix64 seeded by the
//             replay seed (a partial Fisher-Yates shuffle of the remaining steps in step order)
//
// Example:
//   ReplaySample r = sample_replay_steps(scenario, plan.tokens, *pair.replay);
//   r.seed, r.total, r.steps   // printed and stored in /meta/replay (docs/report-schema.md)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

// One step of a scenario as the runner will number it.
struct PlannedStep {
  int64_t step = 0;
  size_t event = 0;
  std::string session;
  std::string phase;  // "prefill", "decode", "resume", "round"
};

// Every step of the scenario, in run order.
std::vector<PlannedStep> planned_steps(const Scenario& sc, const TokenPlan& tokens);

struct ReplaySample {
  uint64_t seed = 0;            // the replay seed used (spec.seed, else stream_seed(sc.seed, "replay"))
  int64_t total = 0;            // steps in the scenario
  std::vector<int64_t> steps;   // the sampled steps, ascending
  std::vector<int64_t> required;  // the required ones among them, ascending
};

// The replay seed of a scenario's pair: the spec's, else stream_seed(sc.seed, "replay").
uint64_t replay_seed(const Scenario& sc, const ReplaySpec& spec);

// The sample (above). extra larger than the remaining steps takes them all.
ReplaySample sample_replay_steps(const Scenario& sc, const TokenPlan& tokens, const ReplaySpec& spec);

// "0-3, 7, 12" (ascending steps as ranges): how the summary and /meta/replay write a step list.
std::string step_ranges(const std::vector<int64_t>& steps);

}  // namespace dsv41::scenarios::runner
