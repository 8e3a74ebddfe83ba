// reports/report_diff.cc: diff_reports, the text of `dsv41 report diff A.h5 B.h5`.
#include "reports/report_diff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "reports/internal/text.h"

namespace dsv41::reports {
namespace {

using text::num;
using text::rank;

bool failing(Verdict v) { return exit_code(v) != 0; }

// Lines of at most `width` columns: the first prefixed `first`, the rest `rest`, broken at spaces.
void put(std::ostringstream& out, const std::string& text, const std::string& first, const std::string& rest,
         size_t width) {
  std::string line = first;
  bool empty = true;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (!empty && line.size() + 1 + word.size() > width) {
      out << line << "\n";
      line = rest + word;
    } else {
      line += (empty ? "" : " ") + word;
    }
    empty = false;
    at = end + 1;
  }
  out << line << "\n";
}

using Key = std::pair<std::string, int64_t>;  // (scenario, comparison index)

struct Side {
  const ScenarioResult* scenario = nullptr;
  const Comparison* comparison = nullptr;
};

std::string label(const Key& k, const Comparison& c) {
  return k.first + " #" + std::to_string(k.second) + ": " + c.side_a + " vs " + c.side_b + " [" + c.mode + "]";
}

std::string where(const SummaryRow& r) {
  std::string s = r.component + " " + r.metric + " (step " + std::to_string(r.step);
  if (r.layer >= 0) s += " layer " + std::to_string(r.layer);
  return s + ")";
}

double excess_of(const SummaryRow& r) { return excess(r.value, Tolerance{r.bound, r.higher_is_better, r.origin, ""}); }

// How far an unchecked worst value lies from "equal", larger is worse (NaN worst).
double distance(const SummaryRow& r) {
  if (std::isnan(r.value)) return INFINITY;
  return metric_higher_is_better(r.metric) ? -r.value : r.value;
}

struct Line {
  double order;       // within a section, larger first
  std::string group;  // the comparison it belongs to ("": a line of its own)
  std::string text;
};

// Metrics that are positions, not distances: their changes are listed without better / worse.
bool positional(const std::string& metric) {
  return metric == "first_mismatch" || metric == "first_mismatch_byte" || metric == "margin_a";
}

}  // namespace

ReportDiff diff_reports(const RunReport& a, const RunReport& b, const DiffOptions& o) {
  ReportDiff d;
  std::ostringstream out;
  const size_t W = o.width;
  out << "dsv41 report diff: " << o.name_a << " (verdict " << name(a.verdict) << ") -> " << o.name_b << " (verdict "
      << name(b.verdict) << ")\n";
  if (a.meta.config_hash != b.meta.config_hash) {
    put(out, "note: the configs differ (hash " + a.meta.config_hash + " vs " + b.meta.config_hash + ")", "", "  ", W);
  }
  if (a.meta.weights != b.meta.weights || a.meta.weights_sha256 != b.meta.weights_sha256) {
    put(out, "note: the weights differ (" + a.meta.weights + " vs " + b.meta.weights + ")", "", "  ", W);
  }

  std::map<Key, std::pair<Side, Side>> cmp;  // in (scenario, index) order
  std::vector<Key> order;                    // run order of A, then what only B has
  std::map<std::string, std::pair<const ScenarioResult*, const ScenarioResult*>> scen;
  for (int side = 0; side < 2; ++side) {
    for (const ScenarioResult& s : (side == 0 ? a : b).scenarios) {
      (side == 0 ? scen[s.name].first : scen[s.name].second) = &s;
      for (size_t i = 0; i < s.comparisons.size(); ++i) {
        const Key k{s.name, static_cast<int64_t>(i)};
        if (!cmp.count(k)) order.push_back(k);
        Side& x = side == 0 ? cmp[k].first : cmp[k].second;
        x = {&s, &s.comparisons[i]};
      }
    }
  }
  std::map<std::tuple<std::string, int64_t, std::string, std::string>, SummaryRow> rows_a;
  for (const SummaryRow& r : summarize(a)) rows_a[{r.scenario, r.comparison, r.component, r.metric}] = r;
  std::map<Key, std::vector<SummaryRow>> rows_b;
  for (const SummaryRow& r : summarize(b)) rows_b[{r.scenario, r.comparison}].push_back(r);

  std::vector<Line> new_fail, worse, missing, better, measured;
  std::vector<std::string> notes;
  // Scenarios that errored in one report only.
  for (const auto& [n, p] : scen) {
    const bool ea = p.first && p.first->verdict == Verdict::kError, eb = p.second && p.second->verdict == Verdict::kError;
    if (eb && !ea && p.second->comparisons.empty()) {
      new_fail.push_back({1e300, "", "scenario " + n + ": error: " + p.second->error});
    } else if (ea && !eb && p.second) {
      better.push_back({1e300, "", "scenario " + n + ": no longer errors (" + name(p.second->verdict) + ")"});
    }
    if (p.first && !p.second) missing.push_back({0, "", "scenario " + n + " (" + name(p.first->verdict) + " in " + o.name_a + ")"});
  }
  for (const Key& k : order) {
    const auto& [sa, sb] = cmp[k];
    if (sb.comparison == nullptr) {
      if (sa.scenario && scen[k.first].second) {
        missing.push_back({0, "", label(k, *sa.comparison) + " (" + name(sa.comparison->verdict) + " in " + o.name_a + ")"});
      }
      continue;
    }
    const Comparison& cb = *sb.comparison;
    if (sa.comparison == nullptr) {
      const std::string t = label(k, cb) + ": new in " + o.name_b + ", " + name(cb.verdict);
      if (failing(cb.verdict)) {
        new_fail.push_back({1e299, "", t});
      } else {
        notes.push_back(t);
      }
      continue;
    }
    const Comparison& ca = *sa.comparison;
    if (ca.side_a != cb.side_a || ca.side_b != cb.side_b || ca.mode != cb.mode) {
      notes.push_back(label(k, ca) + " is " + cb.side_a + " vs " + cb.side_b + " [" + cb.mode + "] in " + o.name_b);
    }
    bool changed = false;
    if (ca.verdict != cb.verdict) {
      changed = true;
      const std::string group = label(k, cb);
      std::string t = std::string(name(ca.verdict)) + " -> " + name(cb.verdict);
      if (cb.first_divergence && failing(cb.verdict)) {
        const Divergence& dv = *cb.first_divergence;
        t += "; first divergence: step " + std::to_string(dv.step) + (dv.layer >= 0 ? " layer " + std::to_string(dv.layer) : "") +
             " component " + dv.component + " " + dv.metric + "=" + num(dv.value);
      } else if (failing(cb.verdict) && !cb.notes.empty()) {
        t += "; " + cb.notes.front();
      }
      if (failing(cb.verdict) && rank(cb.verdict) < rank(ca.verdict)) {
        (failing(ca.verdict) ? worse : new_fail).push_back({1e298, group, t});
      } else if (rank(cb.verdict) > rank(ca.verdict) || !failing(cb.verdict)) {
        better.push_back({1e298, group, t});
      } else {
        worse.push_back({1e298, group, t});  // e.g. error -> inconclusive: another failure
      }
    }
    for (const SummaryRow& rb : rows_b[k]) {
      const auto it = rows_a.find({k.first, k.second, rb.component, rb.metric});
      const std::string group = label(k, cb), item = where(rb);
      if (it == rows_a.end()) {
        if (!rb.origin.empty() && rb.verdict == Verdict::kFail) new_fail.push_back({excess_of(rb), group, item + " fails, new in " + o.name_b});
        continue;
      }
      const SummaryRow& ra = it->second;
      const bool same = ra.value == rb.value || (std::isnan(ra.value) && std::isnan(rb.value));
      if (same && ra.verdict == rb.verdict) continue;
      changed = true;
      const std::string move = item + ": " + num(ra.value) + " -> " + num(rb.value);
      if (!rb.origin.empty() && !ra.origin.empty()) {
        const double ea = excess_of(ra), eb = excess_of(rb);
        const std::string bound = " (bound " + num(rb.bound) + ", " + rb.origin + ")";
        if (ra.verdict != Verdict::kFail && rb.verdict == Verdict::kFail) {
          new_fail.push_back({eb, group, move + bound});
        } else if (ra.verdict == Verdict::kFail && rb.verdict != Verdict::kFail) {
          better.push_back({ea, group, move + bound + ": fixed"});
        } else if (eb > ea) {
          const bool regress = rb.verdict == Verdict::kFail;
          (regress ? worse : measured).push_back({eb - ea, group, move + bound + (regress ? ": further beyond" : ": worse, within")});
        } else {
          better.push_back({ea - eb, group, move + bound});
        }
      } else {
        const double da = distance(ra), db = distance(rb);
        // Ordered by the relative change; positions (first mismatch, margins) only "changed".
        const double scale = std::max({std::fabs(da), std::fabs(db), 1e-300});
        const double rel = std::isfinite(da) && std::isfinite(db) ? std::fabs(db - da) / scale : INFINITY;
        const char* how = positional(rb.metric) ? " (changed, measured)" : db > da ? " (worse, measured)" : " (better, measured)";
        measured.push_back({positional(rb.metric) ? -1.0 : rel, group, move + how});
      }
    }
    d.unchanged += !changed;
  }

  const auto section = [&](const char* title, std::vector<Line>& lines) {
    if (lines.empty()) return;
    std::stable_sort(lines.begin(), lines.end(), [](const Line& x, const Line& y) { return x.order > y.order; });
    out << "\n" << title << " (" << lines.size() << "):\n";
    const size_t n = std::min(lines.size(), static_cast<size_t>(std::max(0, o.max_rows)));
    // The first n lines, grouped under their comparison (groups in order of their first line).
    std::vector<std::string> groups;
    for (size_t i = 0; i < n; ++i) {
      if (std::find(groups.begin(), groups.end(), lines[i].group) == groups.end()) groups.push_back(lines[i].group);
    }
    for (const std::string& g : groups) {
      if (!g.empty()) put(out, g, "  ", "      ", W);
      for (size_t i = 0; i < n; ++i) {
        if (lines[i].group == g) put(out, lines[i].text, g.empty() ? "  " : "    ", g.empty() ? "      " : "        ", W);
      }
    }
    if (n < lines.size()) out << "  ... " << lines.size() - n << " more (--rows)\n";
  };
  section("new failures", new_fail);
  section("worse (failing further, or another failure)", worse);
  section(("missing in " + o.name_b).c_str(), missing);
  section("better", better);
  section("measured changes, not asserted (and checked values that moved within their bounds)", measured);
  if (!notes.empty()) {
    out << "\nnotes:\n";
    for (const std::string& n : notes) put(out, n, "  ", "      ", W);
  }
  d.new_failures = new_fail.size();
  d.worse = worse.size();
  d.missing = missing.size();
  d.better = better.size();
  d.measured_changes = measured.size();
  d.regressed = d.new_failures + d.worse + d.missing > 0;
  out << "\n" << cmp.size() << " comparisons: " << d.unchanged << " unchanged; " << d.new_failures << " new failures, "
      << d.worse << " worse, " << d.missing << " missing, " << d.better << " better, " << d.measured_changes
      << " measured changes\n";
  out << "report diff: " << (d.regressed ? "regressed (exit 1)" : "no checked item regressed (exit 0)") << "\n";
  d.text = out.str();
  return d;
}

}  // namespace dsv41::reports
