// scenarios/conform/conform_internal.h
//
// Internal to `dsv41 conform` (scenarios/conform/conform.h): what the replay (conform.cc) hands the report
// assembly (conform_report.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "reference/checkpoint/weights.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/compare.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_forcing.h"
#include "scenarios/conform/port_dump.h"

namespace dsv41::scenarios::conform::conform_detail {

// A --tolerances file's text, and its JSON (nesting limits checked), for its bounds
// (conform_judge.cc) and its waivers (conform_waivers.cc); a dsv41::Error naming the file or
// `where` when it cannot be read or is not valid JSON.
std::string read_tolerance_file(const std::string& path);
nlohmann::json parse_tolerance_json(const std::string& text, const std::string& where);

// One dump step judged: the rows of compare_step (unchecked: conform_report.cc gives the bounds)
// and the two captures of each mode (side A the reference, B the port), restricted to what the
// port covers, for the failure details.
struct StepJudgement {
  int64_t step = 0;
  // Teacher-forced, this step or an earlier one rolled a speculative round back: the replay keeps
  // the kept tokens by rerunning them hook-free (reference::model::roll_back), so the caches from
  // here on hold rows no forcing reached. Under order-variant the caches and their readers are
  // then measured (as the runner does, docs/scenarios.md); under bit-exact a correct port's
  // rollback is the reference's, bit for bit, and stays judged.
  bool unforced_caches = false;
  // Teacher-forced caches whose entry format is not the reference's (docs/port-dump.md "Cache
  // layouts"): judged by value, not in forced_port; (layer, "cache.<kind>") -> what a failure shows.
  std::map<std::pair<int, std::string>, std::string> value_judged;
  runner::StepComparison forced, free;
  runner::StepCapture forced_own, forced_port, free_own, free_port;
};

// Whether the port is judged under the order-variant claim (--order-variant, or the manifest's).
inline bool order_variant(const PortDump& d, const ConformOptions& o) {
  return o.order_variant || d.claim == kClaimOrderVariant;
}

// The accumulation the port is judged under (--accumulation, else the manifest's).
inline judge::Accumulation accumulation(const PortDump& d, const ConformOptions& o) {
  return judge::accumulation_from_name(o.accumulation.empty() ? (d.accumulation.empty() ? "fp32" : d.accumulation)
                                                              : o.accumulation);
}

// "cache.window_kv", ...
bool is_cache(const std::string& component);

// "layer 3", or "model" for layer -1.
inline std::string layer_word(int layer) { return layer < 0 ? "model" : "layer " + std::to_string(layer); }

// What a failing item shows (conform_judge.cc): where the values first differ (coordinate, byte,
// values), a selection's first differing row and whether it is a tie, or the cache layout diagnosis.
std::string item_detail(const runner::StepCapture& a, const runner::StepCapture& b, int layer, const std::string& c,
                        const reference::ModelConfig& cfg);

// A dump step as a StepCapture: every component the dump holds (items in table order, the last
// row of model.logits, the caches with their format and dim from the file's metadata, checked).
runner::StepCapture port_capture(const PortDump& d, const PortDumpStep& s);

// One failing (step, layer, component) of the teacher-forced comparison: its first failing row.
struct Failure {
  int64_t step = 0;
  int layer = -1;
  std::string component, metric;
  double value = 0, bound = 0;
  std::string origin, detail, repro;
};
// An independent root cause (docs/conform.md "Root causes"): the failures of one (component,
// layer) that no earlier failure explains, the first of them and the later steps it fails at.
struct RootCauseGroup {
  Failure first;
  std::vector<int64_t> also_steps;
};
// A failure an earlier one explains: the port's component read the port's own wrong state.
struct ExplainedFailure {
  Failure failure, by;
};
// Groups teacher-forced failures (in root-cause order) into independent root causes
// (conform_root_causes.cc). Under teacher forcing every component gets the port's own inputs, so
// a failure is its own root cause, except where the port's step reads state the replay does not
// force: its caches. A failure of an attention (attn_out), an indexer (index_scores, topk,
// candidates) or a cache is explained by an earlier failure (this step or before) of a cache
// it reads (its own, its kv owner's; the compressor's pending rows for the compressed caches).
void group_root_causes(const std::vector<Failure>& failures, const reference::ModelConfig& c,
                       std::vector<RootCauseGroup>& roots, std::vector<ExplainedFailure>& explained);

// Replays the dump's steps in the reference: teacher-forced, and end to end (options.end_to_end).
// A dsv41::Error naming the dump, the file and the key for a port value the reference cannot take.
std::vector<StepJudgement> replay(const PortDump& d, const reference::checkpoint::ModelWeights& weights,
                                  const std::vector<int64_t>& token_map, const ConformOptions& o);

// The mHC comb components (hc_attn_comb, hc_ffn_comb and DSpark's): their column sums are an
// invariant of any summation order (scenarios/judge/invariants.h).
bool is_comb(const std::string& component);

// The bounds (conform_bounds.cc): what each row of the replay is judged against.
extern const char* kExactNote;             // the bit-exact default's origin note
extern const char* kOrderVariantE2eNote;   // end to end under order-variant: measured
// A cache or one of its readers (attn_out, index_scores, topk, candidates, dspark_attn_out): what a
// teacher-forced step after a speculative rollback measures under order-variant.
bool is_cache_or_reader(const std::string& component);
// The rows exact under every claim (present, masks, valid entries, ...).
bool always_exact(const std::string& metric);
// The claim in effect: bit-exact, or order-variant (docs/conform.md "Claims").
struct Claim {
  bool order_variant = false;
  const reference::ModelConfig* config = nullptr;
  judge::Accumulation accumulation = judge::Accumulation::kFp32;
};
// The tolerance file's bounds of a component ("*" when it does not name it); nullptr: bit-exact.
const std::map<std::string, reports::Tolerance>* file_bounds(const ConformTolerances& tol, const std::string& component);
// forced: the teacher-forced comparison; fr: the component's forcing (conform_forcing.h; nullptr:
// teacher-forced): under order-variant a component whose inputs the dump lacks gets its
// free-running bound (its own plus the missing chain's), or is measured when that chain holds a
// selection.
std::optional<reports::Tolerance> bound_of(const ConformTolerances& tol, const std::string& component,
                                           const std::string& metric, const Claim& claim, bool forced,
                                           const Forcing* fr = nullptr);

}  // namespace dsv41::scenarios::conform::conform_detail
