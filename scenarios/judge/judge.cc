#include "scenarios/judge/judge.h"

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"

namespace dsv41::scenarios::judge {

using reports::Comparison;
using reports::MetricRow;
using reports::Verdict;

const char* name(Expectation e) {
  switch (e) {
    case Expectation::kBitExact: return "bitexact";
    case Expectation::kTolerance: return "tolerance";
    case Expectation::kMeasured: return "measured";
  }
  return "?";
}

reports::Tolerance make_tolerance(double bound, bool higher_is_better, const std::string& origin,
                                  const std::string& note) {
  reports::Tolerance t;
  t.bound = bound;
  t.higher_is_better = higher_is_better;
  t.origin = origin;
  t.note = note;
  return t;
}

Verdict judge_value(double value, const std::optional<reports::Tolerance>& tolerance) {
  if (!tolerance) return Verdict::kMeasured;
  return reports::excess(value, *tolerance) > 0 ? Verdict::kFail : Verdict::kPass;  // NaN: +inf, beyond
}

void judge_row(MetricRow& row) { row.verdict = judge_value(row.value, row.tolerance); }

bool component_matches(const std::string& pattern, const std::string& component) {
  if (pattern == "*") return true;
  if (!pattern.empty() && pattern.back() == '*') return component.rfind(pattern.substr(0, pattern.size() - 1), 0) == 0;
  return pattern == component;
}

const ToleranceRule* rule_for(const std::vector<ToleranceRule>& rules, const std::string& component,
                              const std::string& metric) {
  for (const ToleranceRule& rule : rules) {
    if (rule.metric == metric && component_matches(rule.component, component)) return &rule;
  }
  return nullptr;
}

Verdict comparison_verdict(Comparison& cmp, Expectation expect, const Evidence& e) {
  bool failed = false;
  for (const MetricRow& r : cmp.rows) failed = failed || r.verdict == Verdict::kFail;
  if (failed) return Verdict::kFail;
  std::string gap = e.backend_gap;
  // Probe steps exist to measure recall on both sides of a resume boundary: without a
  // boundary, or when side A's selections never reach across it, the scenario has not tested
  // what it claims (missing evidence, never a pass).
  int64_t before = 0, after = 0, probe_rows_seen = 0;
  for (const MetricRow& r : cmp.rows) {
    if (r.metric.rfind("probe_count", 0) == 0) ++probe_rows_seen;
    if (r.metric == "probe_count[d<-W]" || r.metric == "probe_count[-W<=d<0]") before += static_cast<int64_t>(r.value);
    if (r.metric == "probe_count[0<=d<W]" || r.metric == "probe_count[d>=W]") after += static_cast<int64_t>(r.value);
  }
  if (gap.empty() && e.probes_unmeasured > 0) {
    gap = std::to_string(e.probes_unmeasured) + " probe step(s) ran without a resume boundary before them in their "
          "session: recall by distance was not measured";
  }
  if (gap.empty() && probe_rows_seen > 0 && (before == 0 || after == 0)) {
    gap = "side A's probe selections did not straddle the resume boundary (" + std::to_string(before) +
          " before, " + std::to_string(after) + " after it)";
  }
  if (gap.empty() && cmp.items_compared == 0) gap = "nothing was compared";
  if (gap.empty()) {
    for (const MetricRow& r : cmp.rows) {
      if (r.metric == "present" && r.value < 1.0) {
        gap = "an output is missing on one side (" + r.component + ", layer " + std::to_string(r.layer) + ", step " +
              std::to_string(r.step) + ")";
        break;
      }
    }
  }
  if (gap.empty() && !e.nonfinite_items.empty()) {
    gap = "outputs hold NaN or Inf (non-finite values prove nothing, even when equal): " +
          *e.nonfinite_items.begin() +
          (e.nonfinite_items.size() > 1 ? " and " + std::to_string(e.nonfinite_items.size() - 1) + " more" : "");
  }
  if (gap.empty() && !e.vacuous_items.empty()) {
    gap = "outputs all zero on both sides (a vacuous comparison): " + *e.vacuous_items.begin() +
          (e.vacuous_items.size() > 1 ? " and " + std::to_string(e.vacuous_items.size() - 1) + " more" : "");
  }
  if (!gap.empty()) {
    cmp.notes.push_back(gap);
    return Verdict::kInconclusive;
  }
  return expect == Expectation::kMeasured ? Verdict::kMeasured : Verdict::kPass;
}

reports::Divergence divergence_at(const MetricRow& r) {
  reports::Divergence d;
  d.step = r.step;
  d.session = r.session;
  d.position = r.position;
  d.layer = r.layer;
  d.component = r.component;
  d.metric = r.metric;
  d.value = r.value;
  return d;
}

std::optional<reports::Divergence> first_difference(const std::vector<MetricRow>& rows) {
  for (const MetricRow& r : rows) {
    const bool exactness = r.metric == "bit_equal_frac" || r.metric == "rows_equal_frac" ||
                           r.metric == "bytes_equal_frac" || r.metric == "equal_frac";
    if (!exactness || r.value >= 1.0) continue;
    reports::Divergence d = divergence_at(r);
    d.tolerance.origin = "none";
    d.tolerance.higher_is_better = true;
    d.tolerance.bound = 1.0;
    d.tolerance.note = "measured pair: the first difference, not asserted";
    return d;
  }
  return std::nullopt;
}

Verdict scenario_verdict(const std::vector<Comparison>& comparisons, std::string* error) {
  if (comparisons.empty()) return Verdict::kInconclusive;
  Verdict verdict = Verdict::kPass;
  for (const Comparison& cmp : comparisons) {
    verdict = reports::worse(verdict, cmp.verdict);
    if (cmp.verdict == Verdict::kError && error->empty()) {
      // The scenario's error says which comparison could not complete, and why.
      *error = cmp.side_a + " vs " + cmp.side_b + " [" + cmp.mode + "]";
      for (const std::string& n : cmp.notes) {
        if (n.rfind("error: ", 0) == 0) {
          *error += ": " + n.substr(7);
          break;
        }
      }
    }
  }
  return verdict;
}

PortMetrics port_metrics(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol,
                         const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  DSV41_CHECK(atol >= 0 && rtol >= 0, what, ": atol ", atol, ", rtol ", rtol);
  PortMetrics m;
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (std::isfinite(x) && std::isfinite(y)) {
      ab += x * y;
      aa += x * x;
      bb += y * y;
      if (!(std::fabs(x - y) <= atol + rtol * std::fabs(x))) ++m.allclose_violations;
    } else if (!(std::isinf(x) && x == y)) {  // NaN anywhere, or Inf against another value
      ++m.allclose_violations;
    }
  }
  m.calc_diff = aa + bb > 0 ? 1.0 - 2.0 * ab / (aa + bb) : 0.0;
  m.cosine = aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : (aa == 0 && bb == 0 ? 1.0 : 0.0);
  m.allclose = m.allclose_violations == 0;
  return m;
}

}  // namespace dsv41::scenarios::judge
