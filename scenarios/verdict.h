// scenarios/verdict.h
//
// The verdicts of the scenario runner (docs/scenarios.md): what a pair of sides is expected to
// show, what one comparison (a pair under one mode) concludes from its metric rows and the
// evidence around them, and what a scenario concludes from its comparisons.
//
//   default_expectation  bitexact or measured, for a pair given on the command line
//   comparison_verdict   fail > inconclusive (evidence missing) > measured or pass
//   first_difference     where a measured pair first differs (information, never asserted)
//   scenario_verdict     the worst of the comparisons' verdicts, and the first error
//
// Contract: a verdict is never a pass without evidence. A comparison with no failing row is
// inconclusive, with a note saying why, when a backend could not show something (a planted
// defect that never fired), a probe step had no resume boundary before it or side A's probe
// selections do not straddle it, nothing was compared, an output is missing on one side, the
// outputs compared are all zero on both sides, or an output holds NaN or Inf (equal NaNs prove
// nothing). A scenario with no comparison is inconclusive.
//
// Example:
//   Evidence e;
//   e.probes_unmeasured = 1;
//   cmp.verdict = comparison_verdict(cmp, Expectation::kBitExact, e);  // kInconclusive, a note
//   result.verdict = scenario_verdict(result.comparisons, &result.error);
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "reports/report.h"
#include "scenarios/scenario.h"

namespace dsv41::scenarios {

// The expectation of a pair given on the command line (not in the scenario): bitexact when both
// backends claim the reference's bits and neither path replays (cold/full/alone) or the scenario
// never resumes; measured otherwise. `why` receives the origin.
Expectation default_expectation(const Side& a, const Side& b, const Scenario& s, std::string* why);

// What a comparison's verdict weighs besides its metric rows.
struct Evidence {
  std::string backend_gap;              // what a side's backend could not show ("": nothing)
  int64_t probes_unmeasured = 0;        // probe steps with no resume boundary before them
  std::set<std::string> vacuous_items;  // float outputs all zero on both sides
  std::set<std::string> nonfinite_items;  // float outputs holding NaN/Inf (compare.h): never a pass
};

// The verdict of one comparison from its rows (cmp.rows, cmp.items_compared) and the evidence:
// kFail when a row fails; else kInconclusive, with the reason appended to cmp.notes, when the
// evidence is missing; else kMeasured for a measured pair and kPass otherwise.
reports::Verdict comparison_verdict(reports::Comparison& cmp, Expectation expect, const Evidence& e);

// Where a metric row is (step, session, position, layer, component) and its metric and value;
// the tolerance, detail and rerun command are the caller's to fill.
reports::Divergence divergence_at(const reports::MetricRow& r);

// The first exactness row (bit_equal_frac, rows_equal_frac, bytes_equal_frac, equal_frac) below 1
// of a measured pair, with an unasserted bound of 1; nullopt when every output is equal.
std::optional<reports::Divergence> first_difference(const std::vector<reports::MetricRow>& rows);

// The scenario's verdict: the worst of its comparisons' (kInconclusive when there are none).
// When a comparison ended in an error and *error is empty, *error names that comparison
// ("A vs B [mode]") and the error.
reports::Verdict scenario_verdict(const std::vector<reports::Comparison>& comparisons, std::string* error);

}  // namespace dsv41::scenarios
