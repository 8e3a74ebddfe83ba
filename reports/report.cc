// reports/report.cc: verdicts, their roll-up, and the summary table of a RunReport.
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "base/error.h"
#include "reports/report.h"

namespace dsv41::reports {

int severity(Verdict v) {
  switch (v) {
    case Verdict::kPass: return 0;
    case Verdict::kMeasured: return 1;
    case Verdict::kInconclusive: return 2;
    case Verdict::kFail: return 3;
    case Verdict::kError: return 4;
  }
  return 4;
}

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char ch : s) {
    const bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                    std::string("_@%+=:,./-").find(ch) != std::string::npos;
    plain = plain && ok;
  }
  if (plain) return s;
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

const char* name(Verdict v) {
  switch (v) {
    case Verdict::kPass: return "pass";
    case Verdict::kFail: return "fail";
    case Verdict::kMeasured: return "measured";
    case Verdict::kInconclusive: return "inconclusive";
    case Verdict::kError: return "error";
  }
  return "error";
}

Verdict parse_verdict(const std::string& s) {
  for (Verdict v : {Verdict::kPass, Verdict::kFail, Verdict::kMeasured, Verdict::kInconclusive, Verdict::kError}) {
    if (s == name(v)) return v;
  }
  DSV41_FAIL("unknown verdict '", s, "' (expected pass, fail, measured, inconclusive or error)");
}

Verdict worse(Verdict a, Verdict b) { return severity(b) > severity(a) ? b : a; }

int exit_code(Verdict v) {
  switch (v) {
    case Verdict::kPass:
    case Verdict::kMeasured: return 0;
    case Verdict::kFail: return 1;
    case Verdict::kError: return 2;
    case Verdict::kInconclusive: return 3;
  }
  return 2;
}

Verdict roll_up(const std::vector<ScenarioResult>& scenarios) {
  if (scenarios.empty()) return Verdict::kInconclusive;
  Verdict v = Verdict::kPass;
  for (const ScenarioResult& s : scenarios) v = worse(v, s.verdict);
  return v;
}

double excess(double value, const Tolerance& t) {
  if (std::isnan(value)) return std::numeric_limits<double>::infinity();
  const double beyond = t.higher_is_better ? t.bound - value : value - t.bound;
  const double scale = t.bound != 0 && std::isfinite(t.bound) ? std::fabs(t.bound) : 1.0;
  return beyond / scale;
}

bool metric_higher_is_better(const std::string& m) {
  const auto ends = [&](const char* suffix) {
    const std::string x(suffix);
    return m.size() >= x.size() && m.compare(m.size() - x.size(), x.size(), x) == 0;
  };
  return ends("_frac") || m.rfind("jaccard", 0) == 0 || m.rfind("recall", 0) == 0 ||
         m.find("_recall") != std::string::npos || m == "top1_agree" || m == "tie_equivalent" || m == "present";
}

std::vector<SummaryRow> summarize(const RunReport& report) {
  std::vector<SummaryRow> out;
  for (const ScenarioResult& s : report.scenarios) {
    for (size_t c = 0; c < s.comparisons.size(); ++c) {
      const Comparison& cmp = s.comparisons[c];
      std::map<std::pair<std::string, std::string>, size_t> at;  // (component, metric) -> row of out
      std::vector<double> worst;  // per new row: its excess (checked) or value (unchecked)
      const size_t first = out.size();
      for (const MetricRow& m : cmp.rows) {
        const auto key = std::make_pair(m.component, m.metric);
        auto it = at.find(key);
        if (it == at.end()) {
          it = at.emplace(key, out.size()).first;
          SummaryRow r;
          r.scenario = s.name;
          r.comparison = static_cast<int64_t>(c);
          r.side_a = cmp.side_a;
          r.side_b = cmp.side_b;
          r.mode = cmp.mode;
          r.component = m.component;
          r.metric = m.metric;
          r.verdict = m.verdict;
          out.push_back(r);
          worst.push_back(std::numeric_limits<double>::quiet_NaN());
        }
        SummaryRow& r = out[it->second];
        double& w = worst[it->second - first];
        r.verdict = r.rows == 0 ? m.verdict : worse(r.verdict, m.verdict);
        const bool row_checked = !r.origin.empty();
        const bool higher = metric_higher_is_better(m.metric);
        const double score = m.tolerance ? excess(m.value, *m.tolerance)
                             : std::isnan(m.value) ? std::numeric_limits<double>::infinity()
                                                   : (higher ? -m.value : m.value);
        // A checked row always beats an unchecked one; otherwise the larger score wins (the
        // first on ties).
        bool take = r.rows == 0;
        if (!take && m.tolerance && !row_checked) take = true;
        if (!take && (m.tolerance.has_value() == row_checked) && score > w) take = true;
        if (take) {
          w = score;
          r.value = m.value;
          r.step = m.step;
          r.layer = m.layer;
          r.bound = m.tolerance ? m.tolerance->bound : std::numeric_limits<double>::quiet_NaN();
          r.higher_is_better = m.tolerance ? m.tolerance->higher_is_better : higher;
          r.origin = m.tolerance ? m.tolerance->origin : "";
        }
        ++r.rows;
      }
    }
  }
  return out;
}

}  // namespace dsv41::reports
