// scenarios/judge/judge.h
//
// The judge: the one place that decides what "equal enough" means (docs/architecture.md, "The
// judge"). Every verb that checks something (run, agree, conform, vectors, selftest, Python's
// dsv41.check) turns a metric into a verdict here, with the same rule, and finds the first
// divergence here. The metrics themselves are scenarios/judge/metrics.h; the order-variant
// bounds and their origins scenarios/judge/derived_bounds.h.
//
//   judge_value / judge_row  no tolerance: measured; beyond its bound (reports::excess > 0, and a
//                            NaN is always beyond): fail; else pass
//   rule_for                 the tolerance rule of a "tolerance" pair that bounds a metric
//   divergence_at            where a row is, for a first divergence (tolerance, detail, rerun: the caller's)
//   first_difference         where a measured pair first differs (information, never asserted)
//   comparison_verdict       fail > inconclusive (evidence missing) > measured or pass
//   scenario_verdict         the worst of a scenario's comparisons, and the first error
//   port_metrics             calc_diff, cosine and allclose, the metrics port engineers use
//
// Contract: a verdict is never a pass without evidence. A comparison with no failing row is
// inconclusive, with a note saying why, when a backend could not show something (a planted
// defect that never fired), a probe step had no resume boundary before it or side A's probe
// selections do not straddle it, nothing was compared, an output is missing on one side, the
// outputs compared are all zero on both sides, or an output holds NaN or Inf (equal NaNs prove
// nothing). A scenario with no comparison is inconclusive.
//
// Example:
//   reports::MetricRow r;  r.metric = "nmse";  r.value = 3e-7;
//   r.tolerance = make_tolerance(1e-6, false, "derived", "fp32 sum of 512 terms");
//   judge_row(r);                                   // kPass
//   cmp.verdict = comparison_verdict(cmp, Expectation::kBitExact, Evidence{});
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "reports/report.h"

namespace dsv41::scenarios::judge {

// What a pair of sides is expected to show: the same bits, agreement within tolerance rules,
// or differences that are measured and never asserted.
enum class Expectation { kBitExact, kTolerance, kMeasured };
const char* name(Expectation e);

// A tolerance with its origin ("stated", "derived", "measured", ...) and a note saying why.
reports::Tolerance make_tolerance(double bound, bool higher_is_better, const std::string& origin,
                                  const std::string& note = "");

// The verdict of a value under its tolerance (none: kMeasured).
reports::Verdict judge_value(double value, const std::optional<reports::Tolerance>& tolerance);
// row.verdict from row.value and row.tolerance (judge_value).
void judge_row(reports::MetricRow& row);

// A tolerance rule of a "tolerance" pair: the first rule whose component pattern matches (exact
// name, a prefix ending in '*', or "*") and whose metric matches bounds that metric.
struct ToleranceRule {
  std::string component;   // "attn_out", "hc_*", "cache.*", "*"
  std::string metric;      // a metric name (docs/metrics.md)
  reports::Tolerance tolerance;
};
bool component_matches(const std::string& pattern, const std::string& component);
// The first rule of `rules` that bounds (component, metric); nullptr when none does.
const ToleranceRule* rule_for(const std::vector<ToleranceRule>& rules, const std::string& component,
                              const std::string& metric);

// Where a metric row is (step, session, position, layer, component) and its metric and value;
// the tolerance, detail and rerun command are the caller's to fill.
reports::Divergence divergence_at(const reports::MetricRow& r);

// The first exactness row (bit_equal_frac, rows_equal_frac, bytes_equal_frac, equal_frac) below 1
// of a measured pair, with an unasserted bound of 1; nullopt when every output is equal.
std::optional<reports::Divergence> first_difference(const std::vector<reports::MetricRow>& rows);

// What a comparison's verdict weighs besides its metric rows.
struct Evidence {
  std::string backend_gap;              // what a side's backend could not show ("": nothing)
  int64_t probes_unmeasured = 0;        // probe steps with no resume boundary before them
  std::set<std::string> vacuous_items;  // float outputs all zero on both sides
  std::set<std::string> nonfinite_items;  // float outputs holding NaN/Inf: never a pass
};

// The verdict of one comparison from its rows (cmp.rows, cmp.items_compared) and the evidence:
// kFail when a row fails; else kInconclusive, with the reason appended to cmp.notes, when the
// evidence is missing; else kMeasured for a measured pair and kPass otherwise.
reports::Verdict comparison_verdict(reports::Comparison& cmp, Expectation expect, const Evidence& e);

// The scenario's verdict: the worst of its comparisons' (kInconclusive when there are none).
// When a comparison ended in an error and *error is empty, *error names that comparison
// ("A vs B [mode]") and the error.
reports::Verdict scenario_verdict(const std::vector<reports::Comparison>& comparisons, std::string* error);

// The metrics port engineers use, over the pairs finite on both sides (double sums):
//   calc_diff = 1 - 2<a,b> / (|a|^2 + |b|^2)   (0 when both are all zero)
//   cosine    = <a,b> / (|a| |b|)                (1 when both are all zero, 0 when one is)
//   allclose  every |a - b| <= atol + rtol |a| (a = the reference; NaN/Inf must sit at the same
//             places with the same sign), violations counted
struct PortMetrics {
  double calc_diff = 0, cosine = 1;
  bool allclose = true;
  int64_t allclose_violations = 0;
};
// a, b: the same length (else a dsv41::Error naming `what`). atol, rtol >= 0.
PortMetrics port_metrics(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol,
                         const std::string& what);

}  // namespace dsv41::scenarios::judge
