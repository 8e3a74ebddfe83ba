#include "scenarios/verdict.h"

#include "scenarios/backend.h"

namespace dsv41::scenarios {

using reports::Comparison;
using reports::MetricRow;
using reports::Verdict;

Expectation default_expectation(const Side& a, const Side& b, const Scenario& s, std::string* why) {
  const bool resumes = [&] {
    for (const Event& e : s.events) {
      if (e.kind == Event::kResume) return true;
    }
    return false;
  }();
  const auto exact_backend = [](const Side& x) { return backend_claim(x.backend) == Claim::kBitExact; };
  const auto exact_path = [&](const Side& x) {
    return !resumes || x.path == CachePath::kCold || x.path == CachePath::kFull || x.path == CachePath::kAlone;
  };
  const bool same_path = a.path == b.path && a.decoder_rows == b.decoder_rows;
  if (exact_backend(a) && exact_backend(b) && same_path) {
    *why = "both backends claim the reference's bits and take the same cache path: the same computation";
    return Expectation::kBitExact;
  }
  if (exact_backend(a) && exact_backend(b) && exact_path(a) && exact_path(b)) {
    *why = "both backends claim the reference's bits and no path replays (docs/sessions.md: chunking, full resume "
           "and separate sessions are exact)";
    return Expectation::kBitExact;
  }
  *why = !exact_backend(a) || !exact_backend(b)
             ? "a backend is approximate by design (ref-bf16kv: precision ablation)"
             : "bounded replay (global / decoder path) is approximate by design (docs/replay-divergence.md)";
  return Expectation::kMeasured;
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

}  // namespace dsv41::scenarios
