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

#include "base/error.h"
#include "reports/internal/report_replay.h"
#include "reports/internal/text.h"
#include "base/terminal_text.h"
#include "reports/report.h"

namespace dsv41::reports {
namespace {

using text::num;
using text::rank;

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
      << " rounds; mean accepted m " << num(m / n) << ", mean tokens per round " << num(m / n + 1)
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


// Breaks `text` into lines of at most `width` columns, the first prefixed with `first`, the rest
// with `rest`: a clause (text between "; ") that does not fit the line starts the next one, a
// clause longer than a line breaks at spaces, a word longer than a line runs on.
std::vector<std::string> wrap(const std::string& text, const std::string& first, const std::string& rest,
                              size_t width) {
  std::vector<std::string> clauses;
  for (size_t at = 0;;) {
    const size_t end = text.find("; ", at);
    clauses.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end + 1 - at));
    if (end == std::string::npos) break;
    at = end + 2;
  }
  std::vector<std::string> out;
  std::string line = first;
  bool empty = true;  // nothing of `text` on `line` yet
  for (const std::string& clause : clauses) {
    if (!empty && line.size() + 1 + clause.size() > width) {
      out.push_back(line);
      line = rest;
      empty = true;
    }
    for (size_t at = 0; at < clause.size();) {
      size_t end = clause.find(' ', at);
      if (end == std::string::npos) end = clause.size();
      const std::string word = clause.substr(at, end - at);
      if (!empty && line.size() + 1 + word.size() > width) {
        out.push_back(line);
        line = rest + word;
      } else {
        line += (empty ? "" : " ") + word;
      }
      empty = false;
      at = end + 1;
    }
  }
  out.push_back(line);
  return out;
}

// A shell command in lines of at most `width` columns, continued with " \": copied whole, it runs.
std::vector<std::string> wrap_command(const std::string& cmd, const std::string& first, const std::string& rest,
                                      size_t width) {
  std::vector<std::string> words(1);  // split at spaces outside single quotes
  bool quoted = false;
  for (char ch : cmd) {
    if (ch == '\'') quoted = !quoted;
    if (ch == ' ' && !quoted) {
      if (!words.back().empty()) words.emplace_back();
    } else {
      words.back() += ch;
    }
  }
  std::vector<std::string> lines;
  std::string line = first;
  bool empty = true;
  for (const std::string& w : words) {
    if (!empty && line.size() + 1 + w.size() + 2 > width) {
      lines.push_back(line + " \\");
      line = rest + w;
    } else {
      line += (empty ? "" : " ") + w;
    }
    empty = false;
  }
  lines.push_back(line);
  return lines;
}

void put(std::ostringstream& out, const std::vector<std::string>& lines) {
  for (const std::string& l : lines) out << l << "\n";
}

bool side_matches(const std::string& side, const std::string& want) {
  return side == want || side.substr(0, side.find('@')) == want;
}

// How far a measured (unchecked) summary row lies from equal, comparable across the relative
// metrics (NMSE, KL, 1 - a fraction); NaN when the metric is not one of them.
double measured_distance(const SummaryRow& r) {
  if (metric_higher_is_better(r.metric)) return std::isnan(r.value) ? INFINITY : 1.0 - r.value;
  if (r.metric == "nmse" || r.metric == "kl") return std::isnan(r.value) ? INFINITY : r.value;
  return NAN;
}

constexpr const char* kIndentText = "               ";  // the detail lines' indent (15 columns)

}  // namespace

bool SummaryFilter::matches_scenario(const ScenarioResult& s) const {
  if (!scenario.empty() && s.name != scenario) return false;
  if (!verdicts.empty() && std::find(verdicts.begin(), verdicts.end(), s.verdict) == verdicts.end()) return false;
  return pair.empty() && mode.empty();
}

bool SummaryFilter::matches(const ScenarioResult& s, const Comparison& c) const {
  if (!scenario.empty() && s.name != scenario) return false;
  if (!mode.empty() && c.mode != mode) return false;
  if (!verdicts.empty() && std::find(verdicts.begin(), verdicts.end(), c.verdict) == verdicts.end()) return false;
  if (!pair.empty()) {
    const size_t comma = pair.find(',');
    if (comma == std::string::npos) return side_matches(c.side_a, pair) || side_matches(c.side_b, pair);
    return side_matches(c.side_a, pair.substr(0, comma)) && side_matches(c.side_b, pair.substr(comma + 1));
  }
  return true;
}

std::string format_summary(const RunReport& report, int max_rows) {
  SummaryOptions o;
  o.max_rows = max_rows;
  return format_summary(report, o);
}

namespace {
std::string summary_text(const RunReport& report, const SummaryOptions& opt);
}  // namespace

// The names in a report are anyone's: control characters are shown escaped (base/terminal_text.h).
std::string format_summary(const RunReport& report, const SummaryOptions& opt) {
  return terminal_safe(summary_text(report, opt));
}

namespace {
std::string summary_text(const RunReport& report, const SummaryOptions& opt) {
  const SummaryFilter& f = opt.filter;
  const size_t W = opt.width;
  // A filter that names what the report lacks is a mistake, not an empty answer.
  if (!f.scenario.empty() &&
      std::none_of(report.scenarios.begin(), report.scenarios.end(), [&](const ScenarioResult& s) { return s.name == f.scenario; })) {
    std::string names;
    for (const ScenarioResult& s : report.scenarios) names += (names.empty() ? "" : ", ") + s.name;
    DSV41_FAIL("report show: no scenario '", f.scenario, "' in the report (it has: ", names, ")");
  }
  if (!f.pair.empty()) {
    std::set<std::string> sides;
    bool any = false;
    for (const ScenarioResult& s : report.scenarios) {
      for (const Comparison& c : s.comparisons) {
        sides.insert(c.side_a);
        sides.insert(c.side_b);
        SummaryFilter p;
        p.pair = f.pair;
        any = any || p.matches(s, c);
      }
    }
    if (!any) {
      std::string names;
      for (const std::string& n : sides) names += (names.empty() ? "" : ", ") + n;
      DSV41_FAIL("report show: no comparison of the sides '", f.pair, "' in the report (its sides: ", names, ")");
    }
  }

  // The entries: one per comparison, and one per scenario that errored before any comparison, or
  // errored itself while none of its comparisons did (so an error is counted once), or has none.
  std::vector<Item> items;
  size_t scenario_counts[5] = {0, 0, 0, 0, 0}, shown_scenarios = 0;
  for (const ScenarioResult& s : report.scenarios) {
    const bool any_error = std::any_of(s.comparisons.begin(), s.comparisons.end(),
                                       [](const Comparison& c) { return c.verdict == Verdict::kError; });
    bool shown = false;
    if (s.comparisons.empty() || (s.verdict == Verdict::kError && !any_error)) {
      if (f.matches_scenario(s)) items.push_back({&s, nullptr, items.size()}), shown = true;
    }
    for (const Comparison& c : s.comparisons) {
      if (f.matches(s, c)) items.push_back({&s, &c, items.size()}), shown = true;
    }
    if (shown || f.empty()) ++scenario_counts[static_cast<int>(s.verdict)], ++shown_scenarios;
  }
  const auto verdict_of = [](const Item& i) { return i.comparison ? i.comparison->verdict : i.scenario->verdict; };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& a, const Item& b) { return rank(verdict_of(a)) < rank(verdict_of(b)); });
  size_t counts[5] = {0, 0, 0, 0, 0};
  for (const Item& i : items) ++counts[static_cast<int>(verdict_of(i))];
  const auto tally = [](const size_t* n) {
    return std::to_string(n[4]) + " error, " + std::to_string(n[1]) + " fail, " + std::to_string(n[3]) +
           " inconclusive, " + std::to_string(n[2]) + " measured, " + std::to_string(n[0]) + " pass";
  };
  std::ostringstream out;
  if (opt.quiet) {
    put(out, wrap("dsv41 report: verdict " + std::string(name(report.verdict)) + " (exit " +
                      std::to_string(exit_code(report.verdict)) + "); " + std::to_string(shown_scenarios) +
                      " scenarios, " + std::to_string(items.size()) + " results: " + tally(counts),
                  "", "  ", W));
    return out.str();
  }
  const RunMeta& m = report.meta;
  out << "dsv41 report: verdict " << name(report.verdict) << " (exit " << exit_code(report.verdict) << ")\n";
  std::string config = "config " + (m.config_name.empty() ? std::string("?") : m.config_name);
  if (!m.config_hash.empty()) config += " (hash " + m.config_hash + ")";
  put(out, wrap(config, "", "  ", W));
  if (!m.weights.empty()) {
    put(out, wrap("weights " + m.weights + (m.weights_sha256.empty() ? "" : " (sha256 " + m.weights_sha256.substr(0, 16) + "...)"),
                  "", "  ", W));
  }
  std::string sides;
  for (size_t i = 0; i < m.sides.size(); ++i) sides += (i ? ", " : "") + m.sides[i];
  put(out, wrap("sides: " + (m.sides.empty() ? std::string("each scenario's pairs") : sides), "", "  ", W));
  if (!f.empty()) {
    std::string fl;
    if (!f.scenario.empty()) fl += " --scenario " + f.scenario;
    if (!f.pair.empty()) fl += " --pair " + f.pair;
    if (!f.mode.empty()) fl += " --mode " + f.mode;
    for (size_t i = 0; i < f.verdicts.size(); ++i) fl += (i ? "," : " --verdict ") + std::string(name(f.verdicts[i]));
    put(out, wrap("filter:" + fl, "", "  ", W));
  }

  out << "\n";
  put(out, wrap(std::to_string(shown_scenarios) + " scenarios: " + tally(scenario_counts), "", "  ", W));
  put(out, wrap(std::to_string(items.size()) + " results: " + tally(counts), "", "  ", W));
  const std::string indent = kIndentText;
  for (const Item& i : items) {
    const std::string head = "  " + pad(name(verdict_of(i)), 13) + i.scenario->name + ": ";
    if (i.comparison == nullptr) {
      put(out, wrap(head + "scenario " + (i.scenario->error.empty() ? "(no comparisons)" : i.scenario->error), "", indent, W));
      continue;
    }
    const Comparison& c = *i.comparison;
    put(out, wrap(head + pair_name(c), "", indent, W));
    std::string what = "expect " + c.expectation + ", " + std::to_string(c.steps_compared) + " steps";
    if (c.first_divergence) {
      const Divergence& d = *c.first_divergence;
      if (d.tolerance.origin == "none") {
        what += "; first difference (measured, not asserted): " + where(d.step, d.layer, d.component) + " " + d.metric +
                "=" + num(d.value);
      } else {
        what += "; first divergence: " + where(d.step, d.layer, d.component) + " " +
                against(d.metric, d.value, d.tolerance.bound, d.tolerance.higher_is_better, d.tolerance.origin);
      }
    } else if (c.verdict != Verdict::kPass && !c.notes.empty()) {
      what += "; " + c.notes.front();
    }
    put(out, wrap(what, indent, indent + "  ", W));
    if (c.first_divergence && !c.first_divergence->detail.empty() && c.verdict == Verdict::kFail) {
      put(out, wrap(c.first_divergence->detail, indent, indent + "  ", W));
    }
    const std::string key = key_numbers(c);
    if (!key.empty()) put(out, wrap(key, indent, indent + "  ", W));
    for (const std::string& line : acceptance_lines(c)) put(out, wrap(line, indent, indent + "  ", W));
    for (const std::string& line : replay_lines(c)) put(out, wrap(line, indent, indent + "  ", W));
  }

  // The worst checked metrics, by how far beyond their bounds; then the measured pairs' worst.
  std::vector<SummaryRow> rows, measured;
  for (const SummaryRow& r : summarize(report)) {
    bool shown = false;
    for (const Item& i : items) shown = shown || (i.comparison && i.scenario->name == r.scenario &&
                                                  i.comparison == &i.scenario->comparisons[static_cast<size_t>(r.comparison)]);
    if (!shown) continue;
    if (!r.origin.empty()) {
      rows.push_back(r);
    } else if (!std::isnan(measured_distance(r)) && measured_distance(r) > 0) {
      measured.push_back(r);
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const SummaryRow& a, const SummaryRow& b) {
    const Tolerance ta{a.bound, a.higher_is_better, a.origin, ""}, tb{b.bound, b.higher_is_better, b.origin, ""};
    if (rank(a.verdict) != rank(b.verdict)) return rank(a.verdict) < rank(b.verdict);
    return excess(a.value, ta) > excess(b.value, tb);
  });
  // Failing metrics first; passing ones only where they were checked against a nonzero bound
  // (a bit-exact pass has nothing worse to show).
  const size_t checked = rows.size();
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [](const SummaryRow& r) {
                              return r.verdict == Verdict::kPass && (r.bound == 0 || (r.higher_is_better && r.bound == 1));
                            }),
             rows.end());
  const size_t limit = static_cast<size_t>(std::max(0, opt.max_rows));
  const size_t shown = std::min(rows.size(), limit);
  out << "\nworst checked metrics (" << shown << " shown; " << checked << " checked, " << checked - rows.size()
      << " exact passes not shown):\n";
  const auto row_text = [](const SummaryRow& r, const std::string& value) {
    return r.scenario + ": " + r.side_a + " vs " + r.side_b + " [" + r.mode + "] " +
           where(r.step, static_cast<int>(r.layer), r.component) + " " + value + " (worst of " + std::to_string(r.rows) + ")";
  };
  for (size_t k = 0; k < shown; ++k) {
    const SummaryRow& r = rows[k];
    put(out, wrap(row_text(r, against(r.metric, r.value, r.bound, r.higher_is_better, r.origin)),
                  "  " + pad(name(r.verdict), 6), "          ", W));
  }
  if (rows.empty()) out << "  (none)\n";
  if (!measured.empty()) {
    std::stable_sort(measured.begin(), measured.end(),
                     [](const SummaryRow& a, const SummaryRow& b) { return measured_distance(a) > measured_distance(b); });
    const size_t n = std::min(measured.size(), limit);
    out << "\nworst measured metrics, not asserted (" << n << " shown of " << measured.size()
        << " that differ; by NMSE, KL or 1 - fraction):\n";
    for (size_t k = 0; k < n; ++k) {
      const SummaryRow& r = measured[k];
      put(out, wrap(row_text(r, r.metric + "=" + num(r.value)), "  ", "      ", W));
    }
  }

  if (opt.by == "layer" || opt.by == "step") {
    for (const Item& i : items) {
      if (i.comparison == nullptr) continue;
      out << "\n";
      put(out, wrap("by " + opt.by + ": " + i.scenario->name + ": " + pair_name(*i.comparison), "", "  ", W));
      put(out, profile_lines(*i.comparison, opt.by, W));
    }
  }

  // How to rerun each failure.
  bool header = false;
  for (const Item& i : items) {
    const Comparison* c = i.comparison;
    if (c == nullptr || c->verdict != Verdict::kFail || !c->first_divergence || c->first_divergence->rerun.empty()) continue;
    if (!header) out << "\nrerun:\n";
    header = true;
    put(out, wrap(i.scenario->name + ": " + pair_name(*c) + ":", "  ", "    ", W));
    put(out, wrap_command(c->first_divergence->rerun, "    ", "      ", W));
  }
  return out.str();
}
}  // namespace

}  // namespace dsv41::reports
