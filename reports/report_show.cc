// reports/report_show.cc: format_summary, the text `dsv41 report show` prints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "reports/report.h"

namespace dsv41::reports {
namespace {

// Display order, worst first: error, fail, inconclusive, measured, pass.
int rank(Verdict v) {
  switch (v) {
    case Verdict::kError: return 0;
    case Verdict::kFail: return 1;
    case Verdict::kInconclusive: return 2;
    case Verdict::kMeasured: return 3;
    case Verdict::kPass: return 4;
  }
  return 0;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string pad(const std::string& s, size_t width) { return s.size() >= width ? s : s + std::string(width - s.size(), ' '); }

// "nmse=0.00123 > 1e-06 (stated)": the value against its bound, with the sign that holds.
std::string against(const std::string& metric, double value, double bound, bool higher_is_better,
                    const std::string& origin) {
  if (origin.empty() || std::isnan(bound)) return metric + "=" + num(value) + " (measured, no bound)";
  const bool within = higher_is_better ? value >= bound : value <= bound;
  const char* sign = higher_is_better ? (within ? ">=" : "<") : (within ? "<=" : ">");
  return metric + "=" + num(value) + " " + sign + " " + num(bound) + " (" + origin + ")";
}

std::string where(int64_t step, int layer, const std::string& component) {
  std::string s = "step " + std::to_string(step);
  if (layer >= 0) s += " layer " + std::to_string(layer);
  return s + " component " + component;
}

std::string pair_name(const Comparison& c) { return c.side_a + " vs " + c.side_b + " [" + c.mode + "]"; }

struct Item {
  const ScenarioResult* scenario;
  const Comparison* comparison;  // null: the scenario itself (an error without comparisons)
  size_t order;
};

// The numbers a reader wants first from a comparison: the logits (worst KL and max |d|, top-1
// agreement, flips by class), the selections (worst Jaccard, candidate block recall) and the
// probe recall by distance to the resume boundary. Empty when nothing differs.
std::string key_numbers(const Comparison& c) {
  double kl = 0, max_abs = 0, jac = 1, block = 1, worst_nmse = 0, tie_band = -1;
  const MetricRow* worst_nmse_row = nullptr;
  int64_t logit_steps = 0, agree = 0, near_tie = 0, substantive = 0;
  bool any_index = false, any_block = false;
  std::vector<std::pair<std::string, double>> probes;  // metric -> min
  for (const MetricRow& r : c.rows) {
    if (r.component == "logits") {
      if (r.metric == "kl") kl = std::max(kl, r.value);
      if (r.metric == "max_abs") max_abs = std::max(max_abs, r.value);
      if (r.metric == "top1_agree") {
        ++logit_steps;
        agree += r.value == 1.0;
      }
      if (r.metric == "flip_class") {
        near_tie += r.value == 1.0;
        substantive += r.value == 2.0;
      }
    } else if (r.metric == "nmse" && r.value > worst_nmse) {
      worst_nmse = r.value;
      worst_nmse_row = &r;
    } else if (r.component == "topk" && r.metric == "tie_band_max") {
      tie_band = std::max(tie_band, r.value);
    } else if (r.component == "topk" && r.metric == "jaccard_min") {
      jac = std::min(jac, r.value);
      any_index = true;
    } else if (r.component == "candidates" && r.metric == "block_recall_min") {
      block = std::min(block, r.value);
      any_block = true;
    } else if (r.metric.rfind("probe_recall", 0) == 0) {
      auto it = std::find_if(probes.begin(), probes.end(), [&](const auto& p) { return p.first == r.metric; });
      if (it == probes.end()) {
        probes.emplace_back(r.metric, r.value);
      } else {
        it->second = std::min(it->second, r.value);
      }
    }
  }
  if (logit_steps == 0 || (max_abs == 0 && jac == 1 && block == 1 && worst_nmse == 0)) return "";
  std::ostringstream o;
  o << "logits: max |d| " << num(max_abs) << ", KL max " << num(kl) << ", top-1 agree " << agree << "/" << logit_steps;
  if (near_tie + substantive > 0) o << " (flips: " << near_tie << " near-tie, " << substantive << " substantive)";
  if (worst_nmse_row != nullptr) {
    o << "; worst nmse " << num(worst_nmse) << " (" << worst_nmse_row->component;
    if (worst_nmse_row->layer >= 0) o << " layer " << worst_nmse_row->layer;
    o << " step " << worst_nmse_row->step << ")";
  }
  if (any_index) o << "; top-k Jaccard min " << num(jac);
  if (tie_band >= 0) o << ", tie band max " << num(tie_band);
  if (any_block) o << "; candidate block recall min " << num(block);
  for (const auto& [metric, v] : probes) o << "; " << metric.substr(6) << " min " << num(v);
  return o.str();
}

// The speculative rounds of a comparison (its acceptance rows), one line per side that has them
// and one on the two sides' accept decisions; empty without rounds. A round is one (step,
// session) of a side; its fields repeat on its rows, so its first row stands for it.
std::vector<std::string> acceptance_lines(const Comparison& c) {
  using Round = std::pair<int64_t, int>;  // (step, session): execution order
  std::map<Round, const AcceptanceRow*> rounds[2];
  for (const AcceptanceRow& r : c.acceptance) {
    if (r.side == "a" || r.side == "b") rounds[r.side == "b"].emplace(Round{r.step, r.session}, &r);
  }
  std::vector<std::string> lines;
  for (int s = 0; s < 2; ++s) {
    if (rounds[s].empty()) continue;
    const std::string side = s == 0 ? "a" : "b";
    double m = 0, k = 0;
    for (const auto& [key, r] : rounds[s]) {
      m += static_cast<double>(r->accepted);
      k += static_cast<double>(r->verified);
    }
    const double n = static_cast<double>(rounds[s].size());
    std::ostringstream o;
    o << "speculative, side " << side << " (" << (s == 0 ? c.side_a : c.side_b) << "): " << rounds[s].size()
      << " rounds, mean accepted m " << num(m / n) << ", mean tokens per round " << num(m / n + 1)
      << ", mean verified k " << num(k / n);
    // Calibration over the verified draft positions with a confidence: the predicted prefix
    // survival S_i against whether the prefix through i was accepted (i < m).
    double survival = 0, survived = 0;
    int64_t positions = 0;
    for (const AcceptanceRow& r : c.acceptance) {
      if (r.side != side || r.draft_index < 0 || r.draft_index >= r.verified || std::isnan(r.confidence) ||
          std::isnan(r.predicted_survival)) {
        continue;
      }
      ++positions;
      survival += r.predicted_survival;
      survived += r.draft_index < r.accepted;
    }
    if (positions > 0) {
      const double p = static_cast<double>(positions);
      o << "; predicted survival mean " << num(survival / p) << " vs realised prefix acceptance " << num(survived / p)
        << " over " << positions << " verified positions";
    }
    lines.push_back(o.str());
  }
  if (rounds[0].empty() != rounds[1].empty()) {
    lines.push_back(std::string("accept decisions: only side ") + (rounds[0].empty() ? "b" : "a") +
                    " has speculative rounds");
  } else if (!rounds[0].empty()) {
    std::set<Round> all;  // the rounds of either side
    for (const auto& side : rounds) {
      for (const auto& [key, r] : side) all.insert(key);
    }
    const auto decision = [&](int s, const Round& key) -> std::string {
      const auto it = rounds[s].find(key);
      if (it == rounds[s].end()) return "no round";
      return "m=" + std::to_string(it->second->accepted) + " next_token=" + std::to_string(it->second->next_token);
    };
    std::string first;
    for (const Round& key : all) {
      const std::string da = decision(0, key), db = decision(1, key);
      if (da == db) continue;
      first = "accept decisions: first differ at step " + std::to_string(key.first) + " session " +
              std::to_string(key.second) + ": a " + da + ", b " + db;
      break;
    }
    lines.push_back(first.empty() ? "accept decisions identical in " + std::to_string(all.size()) + " rounds" : first);
  }
  return lines;
}

}  // namespace

std::string format_summary(const RunReport& report, int max_rows) {
  std::ostringstream out;
  const RunMeta& m = report.meta;
  out << "dsv41 report: verdict " << name(report.verdict) << " (exit " << exit_code(report.verdict) << ")\n"
      << "config " << (m.config_name.empty() ? "?" : m.config_name);
  if (!m.config_hash.empty()) out << " (hash " << m.config_hash << ")";
  if (!m.weights.empty()) out << ", weights " << m.weights;
  out << "\nsides: ";
  for (size_t i = 0; i < m.sides.size(); ++i) out << (i ? ", " : "") << m.sides[i];
  out << (m.sides.empty() ? "each scenario's pairs\n" : "\n");

  // Comparisons, worst first (run order within a verdict).
  std::vector<Item> items;
  for (const ScenarioResult& s : report.scenarios) {
    if (s.comparisons.empty() || s.verdict == Verdict::kError) items.push_back({&s, nullptr, items.size()});
    for (const Comparison& c : s.comparisons) items.push_back({&s, &c, items.size()});
  }
  const auto verdict_of = [](const Item& i) { return i.comparison ? i.comparison->verdict : i.scenario->verdict; };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& a, const Item& b) { return rank(verdict_of(a)) < rank(verdict_of(b)); });
  size_t counts[5] = {0, 0, 0, 0, 0};
  for (const Item& i : items) ++counts[static_cast<int>(verdict_of(i))];
  out << "\n" << report.scenarios.size() << " scenarios, " << items.size() << " results: " << counts[4]
      << " error, " << counts[1] << " fail, " << counts[3] << " inconclusive, " << counts[2] << " measured, "
      << counts[0] << " pass\n";
  for (const Item& i : items) {
    out << "  " << pad(name(verdict_of(i)), 13) << i.scenario->name << ": ";
    if (i.comparison == nullptr) {
      out << "scenario " << (i.scenario->error.empty() ? "(no comparisons)" : i.scenario->error) << "\n";
      continue;
    }
    const Comparison& c = *i.comparison;
    out << pair_name(c) << ", expect " << c.expectation << ", " << c.steps_compared << " steps";
    if (c.first_divergence) {
      const Divergence& d = *c.first_divergence;
      if (d.tolerance.origin == "none") {
        out << "; first difference (measured, not asserted): " << where(d.step, d.layer, d.component) << " "
            << d.metric << "=" << num(d.value);
      } else {
        out << "; first divergence: " << where(d.step, d.layer, d.component) << " "
            << against(d.metric, d.value, d.tolerance.bound, d.tolerance.higher_is_better, d.tolerance.origin);
      }
    } else if (c.verdict != Verdict::kPass && !c.notes.empty()) {
      out << "; " << c.notes.front();
    }
    out << "\n";
    if (c.first_divergence && !c.first_divergence->detail.empty() && c.verdict == Verdict::kFail) {
      out << "               " << c.first_divergence->detail << "\n";
    }
    const std::string key = key_numbers(c);
    if (!key.empty()) out << "               " << key << "\n";
    for (const std::string& line : acceptance_lines(c)) out << "               " << line << "\n";
  }

  // The worst checked metrics, by how far beyond their bounds.
  std::vector<SummaryRow> rows;
  for (const SummaryRow& r : summarize(report)) {
    if (!r.origin.empty()) rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const SummaryRow& a, const SummaryRow& b) {
    const Tolerance ta{a.bound, a.higher_is_better, a.origin, ""}, tb{b.bound, b.higher_is_better, b.origin, ""};
    const double ea = excess(a.value, ta), eb = excess(b.value, tb);
    if (rank(a.verdict) != rank(b.verdict)) return rank(a.verdict) < rank(b.verdict);
    return ea > eb;
  });
  // Failing metrics first; passing ones only where they were checked against a nonzero bound
  // (a bit-exact pass has nothing worse to show).
  const size_t checked = rows.size();
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [](const SummaryRow& r) {
                              return r.verdict == Verdict::kPass && (r.bound == 0 || (r.higher_is_better && r.bound == 1));
                            }),
             rows.end());
  const size_t shown = std::min(rows.size(), static_cast<size_t>(std::max(0, max_rows)));
  out << "\nworst checked metrics (" << shown << " shown; " << checked << " checked, "
      << checked - rows.size() << " exact passes not shown):\n";
  for (size_t k = 0; k < shown; ++k) {
    const SummaryRow& r = rows[k];
    out << "  " << pad(name(r.verdict), 6) << r.scenario << ": " << r.side_a << " vs " << r.side_b << " [" << r.mode
        << "] " << where(r.step, static_cast<int>(r.layer), r.component) << " "
        << against(r.metric, r.value, r.bound, r.higher_is_better, r.origin) << " (worst of " << r.rows << ")\n";
  }
  if (rows.empty()) out << "  (none)\n";

  // How to rerun each failure.
  bool header = false;
  for (const ScenarioResult& s : report.scenarios) {
    for (const Comparison& c : s.comparisons) {
      if (c.verdict != Verdict::kFail || !c.first_divergence || c.first_divergence->rerun.empty()) continue;
      if (!header) out << "\nrerun:\n";
      header = true;
      out << "  " << s.name << ": " << pair_name(c) << ": " << c.first_divergence->rerun << "\n";
    }
  }
  return out.str();
}

}  // namespace dsv41::reports
