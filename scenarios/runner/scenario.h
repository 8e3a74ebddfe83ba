// scenarios/runner/scenario.h
//
// A scenario: a realistic session (or several), written as JSON (docs/scenarios.md is the full
// format), and the pairs of sides it compares with what each pair must show. Parsed and checked
// here; run by scenarios/runner/runner.h.
//
//   {
//     "name": "global_only_hit", "kind": "cache_hit", "description": "...", "seed": 7,
//     "spans": {"fact": {"random": 6}},
//     "events": [
//       {"prompt": [{"random": 100}, {"span": "fact"}, {"random": 20}]},
//       {"decode": 4},
//       {"resume": true},
//       {"prompt": [{"span": "fact"}], "probe": true},
//       {"decode": 4}
//     ],
//     "pairs": [
//       {"a": "ref@cold", "b": "ref@full", "expect": "bitexact", "why": "..."},
//       {"a": "ref@cold", "b": "ref@global", "expect": "measured", "why": "..."}
//     ],
//     "modes": ["free-running", "teacher-forced"]
//   }
//
// Events run in order; each belongs to a session ("session": name, default "main"):
//   prompt  tokens in one step, or in steps of "chunk" tokens; token segments are literal ids,
//           {"random": n} (seeded), {"span": name} (a named span), {"near": name, "change": k}
//           (the span with k tokens replaced: a near-duplicate distractor)
//   decode  n one-token steps, each token the argmax of side A's logits of the previous step
//           (both sides consume the same tokens, so their steps stay aligned)
//   resume  the session pauses and resumes: each side applies its cache path (cold: nothing;
//           full: save with SWA rings + load; global: save global state only + encoder replay;
//           decoder:N: global, then the next prompt step runs the last N rows after the candidate
//           source only). A boundary for the recall-by-distance metrics of probe steps.
//   speculate  n speculative rounds (docs/dspark.md), one step each: side A drafts ("drafts":
//           "dspark", or "lookahead:N" = side A's own greedy continuation of N tokens, computed
//           on a copy of its session), "reject_at" corrupts draft i of round r (the list cycles;
//           -1: none), the verify-length "policy" (fixed:K, threshold:TAU, survival:S) picks k,
//           then each side verifies the same k drafts (or, a plain side, decodes them one token
//           at a time) and decides; both keep side A's decision (lockstep), and the step
//           compares the kept positions, the accept decisions and the caches after the rollback.
//           "temperature"/"top_p": the sampling parameters (default greedy).
// A side is "<backend>@<cache path>[/plain]" (backend: scenarios/runner/backend.h; path default cold);
// the path "alone" runs each session on its own backend instance (the isolation check of
// concurrent sessions); "/plain" makes the side decode a speculative round's tokens one at a
// time instead of verifying them (what speculative decoding must equal).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reports/report.h"
#include "scenarios/judge/judge.h"

namespace dsv41::scenarios::runner {

enum class CachePath { kCold, kFull, kGlobal, kDecoder, kAlone };
const char* name(CachePath p);

struct Side {
  std::string backend;        // e.g. "ref", "ref-bf16kv", "mutant:attn_out:L3:S2"
  CachePath path = CachePath::kCold;
  int64_t decoder_rows = 0;   // kDecoder: N
  bool plain = false;         // "/plain": speculative rounds decoded one token at a time
  std::string text() const;   // "backend@path[/plain]" as given, normalized
};
// "ref", "ref@global", "ref@decoder:16", "mutant:topk:L6:S3@cold"; a dsv41::Error otherwise.
Side parse_side(const std::string& spec);

// Sampled teacher-forced replay (docs/scale.md): side B does not run the whole scenario; at a
// sampled subset of steps it starts from side A's state just before the step (saved with the SWA
// rings in the official bytes and loaded in full mode) and runs that one step with A's values
// forced. The sample always holds the first and last chunk of every prompt event, every resume
// step and the step after it, the first step of every decode and speculate event, plus `extra`
// steps drawn from the others with the replay seed (scenarios/runner/replay_plan.h).
struct ReplaySpec {
  int64_t extra = 0;              // steps drawn beyond the required ones
  std::optional<uint64_t> seed;   // the draw's seed (default: stream_seed(scenario seed, "replay"))
};

struct Pair {
  Side a, b;
  judge::Expectation expect = judge::Expectation::kMeasured;
  std::string why;          // the origin of the expectation (shown in the report)
  std::optional<ReplaySpec> replay;  // given: side B replays sampled steps only (above)
};

struct TokenSegment {
  enum Kind { kLiteral, kRandom, kSpan, kNear } kind = kLiteral;
  std::vector<int64_t> ids;   // kLiteral
  int64_t count = 0;          // kRandom: tokens; kNear: tokens changed
  std::string span;           // kSpan / kNear
};

// A speculate event's rounds (above).
struct SpeculateSpec {
  int64_t rounds = 0;
  std::string policy = "fixed:4";     // reference::model::VerifyPolicy::parse
  enum Drafter { kDSpark, kLookahead } drafter = kDSpark;
  int64_t lookahead = 0;              // kLookahead: N drafts
  std::vector<int64_t> reject_at;     // per round (cycling): the draft index corrupted, -1 none
  double temperature = 0, top_p = 1;
};

struct Event {
  enum Kind { kPrompt, kDecode, kResume, kSpeculate } kind = kPrompt;
  std::string session = "main";
  std::vector<TokenSegment> segments;  // kPrompt
  int64_t chunk = 0;                   // kPrompt: tokens per step (0: one step)
  int64_t decode = 0;                  // kDecode: steps
  bool probe = false;                  // kPrompt/kDecode: report recall by distance to the last resume
  SpeculateSpec speculate;             // kSpeculate
};

struct Scenario {
  std::string name, kind, description;
  std::string source;                  // file path or "builtin:<name>"
  uint64_t seed = 0;
  std::map<std::string, std::vector<TokenSegment>> spans;
  std::vector<Event> events;
  std::vector<Pair> pairs;
  std::vector<std::string> modes;      // "free-running", "teacher-forced"
  std::vector<judge::ToleranceRule> tolerances;
  bool default_tolerances = true;      // the default rules (compare.h) follow the scenario's own
  // "check_bytes": at the end of every prompt event, the global bytes each side holds (its
  // compressed KV and index-key caches) must equal `dsv41 bytes` for the tokens (docs/scale.md).
  bool check_bytes = false;
  std::string json;                    // the scenario as parsed (after defaults)
  std::vector<std::string> notes;      // e.g. "speculative decoding: not run (DSpark not implemented)"
};

// Parses and checks a scenario (source names it in errors: "scenario 'x.json': events[3].decode:
// must be a positive integer, got -1"). Unknown keys are errors (a typo never silently does nothing).
Scenario parse_scenario(const std::string& json_text, const std::string& source);
Scenario load_scenario_file(const std::string& path);

// The built-in suite (scenarios/suite/*.json, compiled in): names in run order, and one by name.
std::vector<std::string> builtin_scenario_names();
Scenario builtin_scenario(const std::string& name);
// A name of the built-in suite, or a path to a scenario file.
Scenario load_scenario(const std::string& name_or_path);

// The concrete tokens of every span and random segment: a deterministic function of the scenario
// seed and the vocab (SplitMix64 stream per segment, documented in docs/scenarios.md).
struct TokenPlan {
  std::map<std::string, std::vector<int64_t>> spans;
  std::vector<std::vector<int64_t>> prompts;  // [event] tokens of each prompt event (empty otherwise)
};
TokenPlan plan_tokens(const Scenario& s, int64_t vocab);

// The seed of one named random stream of a scenario: its seed mixed with FNV-1a 64 of the name
// (token segments "event:E:I", spans "span:NAME:I", speculative rounds "round:STEP").
uint64_t stream_seed(uint64_t seed, const std::string& name);

}  // namespace dsv41::scenarios::runner
