// scenarios/conform/conform_report.cc
//
// `dsv41 conform` (scenarios/conform/conform.h): the rows of the replay (conform.cc) with their bounds (the
// tolerance file or bit-exact), in root-cause order, the failures' details and repro lines, the
// support matrix, the verdicts and the RunReport.
#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "base/error.h"
#include "reference/model/hooks.h"
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_forcing.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/invariants.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/runner/runner.h"
#include "scenarios/runner/verdict.h"

namespace dsv41::scenarios::conform {

using conform_detail::StepJudgement;
using conform_detail::Claim;
using conform_detail::bound_of;
using conform_detail::file_bounds;
using conform_detail::kExactNote;
using conform_detail::kOrderVariantE2eNote;
using json = nlohmann::json;
using reports::MetricRow;
using reports::Tolerance;
using reports::Verdict;

namespace {

// Root-cause order within a step: the layer (model.embed first, the other model.* last), then the
// component's place in reference/model/hooks.h's table, except that a layer's caches come right after
// its attn_in: they are written from attn_in (the window KV, the compressor, the indexer keys)
// BEFORE the step's indexer and attention read them, so a cache written wrong given right inputs
// is upstream of the same layer's index_scores, topk and attn_out (found by `dsv41 selftest`:
// swapped nibbles and wrong key RoPE were otherwise named as attn_out or index_scores).
std::pair<int, int> order_key(const MetricRow& r) {
  static const std::map<std::string, int> rank = [] {
    std::map<std::string, int> m;
    int i = 0;
    const int attn_in = 100 * static_cast<int>(reference::model::Component::kAttnIn);
    int cache = 0;  // the caches keep their table order among themselves
    for (const reference::model::ComponentInfo& row : reference::model::component_table()) {
      m[row.name] = row.kind == reference::model::ComponentKind::kCache ? attn_in + 1 + cache++ : 100 * i;
      ++i;
    }
    return m;
  }();
  const auto it = rank.find(r.component);
  const int c = it == rank.end() ? INT_MAX : it->second;
  const int l = r.layer >= 0 ? r.layer : r.component == reference::model::name(reference::model::Component::kEmbed) ? -1 : INT_MAX;
  return {l, c};
}

struct Only {
  std::string component;
  int layer = INT_MIN;  // INT_MIN: every layer
  bool admits(const std::string& c, int l) const {
    return component.empty() || (c == component && (layer == INT_MIN || l == layer));
  }
};

Only parse_only(const std::string& s) {
  Only o;
  if (s.empty()) return o;
  const size_t at = s.find('@');
  o.component = s.substr(0, at);
  DSV41_CHECK(reference::model::component_from_name(o.component), "--only '", s, "': '", o.component,
              "' is not a component of reference/model/hooks.h");
  if (at != std::string::npos) {
    try {
      size_t used = 0;
      o.layer = std::stoi(s.substr(at + 1), &used);
      DSV41_CHECK(used == s.size() - at - 1, "trailing characters");
    } catch (const std::exception&) {
      DSV41_FAIL("--only '", s, "': expected component or component@layer (layer an integer, -1 for model.)");
    }
  }
  return o;
}

// The metrics port engineers use, for every float output both sides hold (and the logits).
void add_port_rows(const runner::StepCapture& a, const runner::StepCapture& b, int64_t step, const ConformTolerances& tol,
                   const Claim& claim, std::vector<MetricRow>& rows) {
  auto add = [&](int layer, const std::string& c, const std::vector<float>& x, const std::vector<float>& y, int64_t row) {
    const std::map<std::string, Tolerance>* f = file_bounds(tol, c);
    const double atol = f && f->count("atol") ? f->at("atol").bound : 0.0;
    const double rtol = f && f->count("rtol") ? f->at("rtol").bound : 0.0;
    const std::string what = c + " (" + conform_detail::layer_word(layer) + ", step " + std::to_string(step) + ")";
    const judge::PortMetrics p = judge::port_metrics(x, y, atol, rtol, what);
    std::vector<std::pair<const char*, double>> values = {
        {"calc_diff", p.calc_diff}, {"cosine", p.cosine}, {"allclose", p.allclose ? 1.0 : 0.0}};
    if (claim.order_variant) {
      if (c != "index_scores") {
        values.push_back({judge::kRowRelMetric, judge::max_row_relative(x, y, row, what)});
      } else if (const std::optional<double> v =
                     judge::index_scores_rowrel(x, y, row, judge::score_selection(*claim.config, layer), what)) {
        values.push_back({judge::kRowRelMetric, *v});  // else no row of the step decides a selection
      }
      values.push_back({judge::kRowGainMetric,
                        judge::max_row_gain(x, y, row, what, judge::row_gain_sigmas(*claim.config, c, claim.accumulation))});
      values.push_back({judge::kTensorGainMetric, judge::tensor_gain(x, y, what)});
      values.push_back({judge::kTensorBiasMetric, judge::tensor_bias(x, y, what)});
      if (conform_detail::is_comb(c)) {
        values.push_back({judge::kCombColsumMetric,
                          judge::comb_colsum(x, y, claim.config->hc_mult, claim.config->hc_eps, what).max_dev});
      }
    }
    for (const auto& [metric, value] : values) {
      MetricRow r;
      r.step = step;
      r.position = a.start_pos;
      r.layer = layer;
      r.component = c;
      r.metric = metric;
      r.value = value;
      rows.push_back(r);
    }
  };
  for (const runner::CapturedItem& ia : a.items) {
    const runner::CapturedItem* ib = b.find(ia.layer, ia.component);
    if (ia.kind == runner::CapturedItem::kFloat && ib != nullptr && ib->kind == ia.kind && ib->f.shape() == ia.f.shape()) {
      add(ia.layer, ia.component, ia.f.data(), ib->f.data(), ia.f.rank() > 0 ? std::max<int64_t>(1, ia.f.dim(ia.f.rank() - 1)) : 1);
    }
  }
  if (!a.logits.empty() && a.logits.size() == b.logits.size()) {
    add(-1, "logits", a.logits, b.logits, static_cast<int64_t>(a.logits.size()) / std::max<int64_t>(1, a.logit_rows));
  }
}

// Whether the port holds (layer, component) in this step's capture.
bool port_holds(const runner::StepCapture& b, int layer, const std::string& c) {
  if (c == "logits") return !b.logits.empty();
  if (conform_detail::is_cache(c) || c == "cache") {
    for (const reference::model::CacheView& v : b.caches) {
      if (v.layer == layer && "cache." + v.kind == c) return true;
    }
    return c == "cache";
  }
  return b.find(layer, c) != nullptr;
}

// One mode's comparison: its rows bounded, ordered, with the failures' details and repro lines.
reports::Comparison judge(const std::vector<StepJudgement>& steps, bool forced, const PortDump& d,
                          const ConformTolerances& tol, const std::vector<ConformWaiver>& waivers,
                          const ConformOptions& o, const std::string& thin, const ForcingMap& forcing,
                          std::vector<conform_detail::RootCauseGroup>* roots_out = nullptr) {
  const Claim claim{conform_detail::order_variant(d, o), &d.config, conform_detail::accumulation(d, o)};
  reports::Comparison cmp;
  cmp.side_a = "ref";
  cmp.side_b = "port";
  cmp.mode = forced ? kConformTeacherForced : kConformEndToEnd;
  cmp.expectation = claim.order_variant ? "tolerance" : "bitexact";
  cmp.expectation_origin =
      claim.order_variant
          ? std::string(forced ? "order-variant claim: every float component within its derived bound "
                                 "(scenarios/judge/derived_bounds.h, docs/conform.md), the rest exact"
                               : kOrderVariantE2eNote) +
                (tol.empty() ? "" : "; the tolerance file '" + o.tolerances_file + "' wins for the components it names")
      : tol.empty() ? kExactNote
                    : std::string("bit-exact, except the components the tolerance file '") + o.tolerances_file +
                          "' bounds (docs/conform.md)";
  const Only only = parse_only(o.only);
  if (forced) {  // what the dump's thinness leaves unforced (docs/conform.md "Thin dumps")
    for (const std::string& line : forcing_lines(forcing)) {
      const bool selection = line.rfind("topk ", 0) == 0 || line.rfind("candidates ", 0) == 0 || line.rfind("experts ", 0) == 0;
      cmp.notes.push_back("NOT FORCED " + line +
                          (!claim.order_variant ? ": a failure's location includes those inputs"
                           : selection          ? ": measured (its scores' inputs are not the port's: no tie band holds)"
                                                : ": judged with its free-running bound (its own derived bound plus the "
                                                  "missing chain's; measured when the chain holds a selection)"));
    }
  }
  const auto forcing_of = [&](const MetricRow& r) -> const Forcing* {
    const auto it = forcing.find({r.component, r.layer});
    return forced && it != forcing.end() ? &it->second : nullptr;
  };
  const auto inputs_forced = [&](const MetricRow& r) { return forcing_of(r) == nullptr || forcing_of(r)->forced; };
  judge::Evidence ev;
  ev.backend_gap = thin;
  std::set<std::tuple<int64_t, int, std::string>> failed;
  std::set<std::pair<int, std::string>> by_value_noted;  // value-judged caches announced in the notes
  std::vector<conform_detail::Failure> failures;  // in root-cause order
  std::set<size_t> used;  // the waivers that covered a failure
  int64_t first_unforced = -1;  // the first teacher-forced step measured after a rollback
  for (const StepJudgement& j : steps) {
    const runner::StepComparison& sc = forced ? j.forced : j.free;
    const runner::StepCapture& a = forced ? j.forced_own : j.free_own;
    const runner::StepCapture& b = forced ? j.forced_port : j.free_port;
    std::vector<MetricRow> rows;
    for (const MetricRow& r : sc.rows) {
      // End to end, index scores serve the top-k's tie analysis only (docs/conform.md).
      if (!forced && r.component == reference::model::name(reference::model::Component::kIndexScores)) continue;
      const bool by_value = forced && j.value_judged.count({r.layer, r.component}) > 0;
      if ((by_value || port_holds(b, r.layer, r.component)) && only.admits(r.component, r.layer)) rows.push_back(r);
    }
    for (const auto& [item, why] : forced ? j.value_judged : decltype(j.value_judged){}) {
      if (!by_value_noted.insert(item).second || !only.admits(item.second, item.first)) continue;
      cmp.notes.push_back("VALUES " + conform_detail::layer_word(item.first) + " " + item.second + ": " +
                          why.substr(0, why.find("; ")) + " (" + kDecodedRoundingRatioMetric +
                          " <= 1, docs/port-dump.md \"Cache layouts\")");
    }
    std::vector<MetricRow> extra;
    add_port_rows(a, b, j.step, tol, claim, extra);
    for (const MetricRow& r : extra) {
      if (!forced && r.component == reference::model::name(reference::model::Component::kIndexScores)) continue;
      if (only.admits(r.component, r.layer)) rows.push_back(r);
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const MetricRow& x, const MetricRow& y) { return order_key(x) < order_key(y); });
    std::set<std::pair<int, std::string>> items;
    for (MetricRow& r : rows) {
      r.tolerance = bound_of(tol, r.component, r.metric, claim, forced, forcing_of(r));
      if (forced && j.unforced_caches && claim.order_variant && conform_detail::is_cache_or_reader(r.component) &&
          !conform_detail::always_exact(r.metric)) {
        r.tolerance.reset();  // after a speculative rollback: rows no forcing reached (StepJudgement::unforced_caches)
        if (first_unforced < 0) first_unforced = j.step;
      }
      judge::judge_row(r);
      items.insert({r.layer, r.component});
      if (r.verdict == Verdict::kFail) {
        const auto w = std::find_if(waivers.begin(), waivers.end(), [&](const ConformWaiver& x) { return x.covers(r); });
        if (w != waivers.end()) {  // a known failure, waived with its reason: recorded, not failed
          std::ostringstream line;
          line << "WAIVED step " << j.step << " " << conform_detail::layer_word(r.layer) << " " << r.component << ": " << r.metric << " "
               << r.value << " (bound " << r.tolerance->bound << ", " << r.tolerance->origin << "): " << w->reason
               << " (waiver: " << w->describe() << ")";
          cmp.notes.push_back(line.str());
          used.insert(static_cast<size_t>(w - waivers.begin()));
          r.tolerance.reset();
          judge::judge_row(r);
          continue;
        }
      }
      if (r.verdict != Verdict::kFail || !failed.insert({j.step, r.layer, r.component}).second) continue;
      const std::string repro = o.rerun_prefix + " --stop-after-step " + std::to_string(j.step) + " --only " +
                                r.component + (r.layer >= 0 ? "@" + std::to_string(r.layer) : "");
      const auto by_value = forced ? j.value_judged.find({r.layer, r.component}) : j.value_judged.end();
      std::string detail = by_value != j.value_judged.end() ? by_value->second
                                                            : conform_detail::item_detail(a, b, r.layer, r.component, d.config);
      if (r.component == reference::model::name(reference::model::Component::kExperts)) {
        for (const MetricRow& x : rows) {
          if (x.layer != r.layer || x.component != r.component || x.metric != "tie_equivalent") continue;
          detail += x.value >= 1.0 ? "; every difference inside the gate scores' tie band (a tie)"
                                   : "; experts differ outside the gate scores' tie band (not a tie)";
        }
      }
      if (!inputs_forced(r)) {
        std::string missing;
        for (const std::string& m : forcing.at({r.component, r.layer}).missing) missing += (missing.empty() ? "" : ", ") + m;
        detail += "; NOT teacher-forced: its inputs " + missing +
                  " are not in the dump (the reference computed them), so the defect may be in them";
      }
      std::ostringstream line;
      line << "FAIL step " << j.step << " " << conform_detail::layer_word(r.layer) << " " << r.component << ": " << r.metric << " "
           << r.value << " (bound " << r.tolerance->bound << ", " << r.tolerance->origin << "): " << detail
           << "; repro: " << repro;
      cmp.notes.push_back(line.str());
      failures.push_back({j.step, r.layer, r.component, r.metric, r.value, r.tolerance->bound, r.tolerance->origin, detail, repro});
      if (!cmp.first_divergence) {
        reports::Divergence dv = judge::divergence_at(r);
        dv.tolerance = *r.tolerance;
        dv.detail = detail;
        dv.rerun = repro;
        cmp.first_divergence = dv;
      }
    }
    for (const std::string& v : sc.vacuous_items) {
      const size_t sp = v.find(' ');
      if (only.admits(v.substr(0, sp), INT_MIN) || only.component.empty()) ev.vacuous_items.insert(v);
    }
    cmp.items_compared += static_cast<int64_t>(items.size());
    ++cmp.steps_compared;
    for (MetricRow& r : rows) cmp.rows.push_back(std::move(r));
  }
  for (size_t i = 0; i < waivers.size(); ++i) {
    if (!used.count(i)) cmp.notes.push_back("waiver (" + waivers[i].describe() + ") covered no failure here");
  }
  if (forced && !failures.empty()) {  // every independent root cause, before the failures
    std::vector<conform_detail::RootCauseGroup> roots;
    std::vector<conform_detail::ExplainedFailure> explained;
    conform_detail::group_root_causes(failures, d.config, roots, explained);
    std::vector<std::string> lines;
    for (size_t i = 0; i < roots.size(); ++i) {
      const conform_detail::Failure& f = roots[i].first;
      std::ostringstream line;
      line << "ROOT CAUSE " << i + 1 << " of " << roots.size() << ": step " << f.step << " "
           << conform_detail::layer_word(f.layer) << " " << f.component << ": " << f.metric << " " << f.value << " (bound "
           << f.bound << ", " << f.origin << ")";
      if (!roots[i].also_steps.empty()) {
        line << "; also fails at step" << (roots[i].also_steps.size() > 1 ? "s" : "");
        for (size_t k = 0; k < roots[i].also_steps.size(); ++k) line << (k ? ", " : " ") << roots[i].also_steps[k];
      }
      line << "; repro: " << f.repro;
      lines.push_back(line.str());
    }
    for (const conform_detail::ExplainedFailure& e : explained) {
      lines.push_back("EXPLAINED step " + std::to_string(e.failure.step) + " " + conform_detail::layer_word(e.failure.layer) +
                      " " + e.failure.component + ": it reads the port's " + e.by.component + " (" +
                      conform_detail::layer_word(e.by.layer) + "), wrong since step " + std::to_string(e.by.step));
    }
    cmp.notes.insert(cmp.notes.begin(), lines.begin(), lines.end());
    if (roots_out != nullptr) *roots_out = std::move(roots);
  }
  if (first_unforced >= 0) {
    cmp.notes.push_back("teacher-forced, from step " + std::to_string(first_unforced) +
                        " on: a speculative round rolled back (the replay reruns the kept tokens without the port's "
                        "values), so the caches hold rows no forcing reached: the caches and their readers (attn_out, "
                        "index_scores, topk, candidates, dspark_attn_out) are measured, not bounded (their validity "
                        "stays exact)");
  }
  cmp.verdict = judge::comparison_verdict(cmp, judge::Expectation::kBitExact, ev);
  // End to end under the order-variant claim every float row is measured (no derived bound through
  // the whole forward), so a top-1 token that differs is neither explained nor failed: the
  // comparison is then "measured", never "pass" (green) with tokens flipped.
  if (!forced && claim.order_variant && cmp.verdict == Verdict::kPass) {
    int64_t steps = 0, flipped = 0;
    for (const MetricRow& r : cmp.rows) {
      if (r.component != "logits" || r.metric != "top1_agree") continue;
      ++steps;
      flipped += r.value < 1.0;
    }
    if (flipped > 0) {
      cmp.verdict = Verdict::kMeasured;
      cmp.notes.push_back("end to end, the top-1 token differs at " + std::to_string(flipped) + " of " +
                          std::to_string(steps) + " steps; under the order-variant claim no end-to-end bound says "
                          "whether a flip is a near tie, so this comparison is measured, not passed (the "
                          "teacher-forced comparison judges each component)");
    }
  }
  return cmp;
}

// Layers as ranges: "0-3, 5, 7-9".
std::string ranges(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t k = i;
    while (k + 1 < v.size() && v[k + 1] == v[k] + 1) ++k;
    if (!s.empty()) s += ", ";
    s += std::to_string(v[i]);
    if (k > i) s += "-" + std::to_string(v[k]);
    i = k + 1;
  }
  return s;
}

// Why the dump is too thin to judge ("" when it is not): docs/conform.md, "Coverage".
std::string thin_reason(const PortDump& d, const std::vector<std::string>& require) {
  if (d.steps.empty()) return "coverage too thin: the dump holds no step";
  if (d.steps.front().start_pos != 0) {
    return "coverage too thin: the dump starts at position " + std::to_string(d.steps.front().start_pos) +
           " (a resumed session); conform replays from position 0, so dump the whole session";
  }
  if (!require.empty()) {  // a partial port: its own promise replaces the default rule
    std::string missing;
    for (const std::string& c : require) {
      if (!d.components.count(c)) missing += (missing.empty() ? "" : ", ") + c;
    }
    return missing.empty() ? "" : "coverage too thin: --require names " + missing + ", which the dump does not hold";
  }
  if (!d.components.count(reference::model::name(reference::model::Component::kLogits))) {
    return "coverage too thin: the dump holds no logits (model.logits)";
  }
  for (const auto& [c, layers] : d.components) {
    const reference::model::ComponentInfo& row = reference::model::component_info(*reference::model::component_from_name(c));
    if (row.kind == reference::model::ComponentKind::kTensor &&
        std::any_of(layers.begin(), layers.end(), [](int l) { return l >= 0; })) {
      return "";
    }
  }
  return "coverage too thin: the dump holds no per-layer tensor component (layerNN.<component>)";
}

}  // namespace


std::vector<std::string> support_matrix_lines(const PortDump& d) {
  std::vector<std::string> out;
  const std::string steps = d.steps.empty() ? "none" : "0-" + std::to_string(d.steps.back().index);
  const ForcingMap forcing = teacher_forcing(d);
  for (const reference::model::ComponentInfo& row : reference::model::component_table()) {
    const auto it = d.components.find(row.name);
    if (it == d.components.end()) {
      out.push_back(std::string(row.name) + ": not covered");
    } else {
      const bool model = it->second.size() == 1 && it->second.front() < 0;
      std::vector<int> unforced;
      for (int l : it->second) {
        if (!forcing.at({row.name, l}).forced) unforced.push_back(l);
      }
      std::string line = std::string(row.name) + ": " + (model ? "model" : "layers " + ranges(it->second)) + ", steps " + steps;
      if (unforced.empty()) {
        line += "; teacher-forced";
      } else {
        line += unforced.size() == it->second.size() ? "; NOT teacher-forced" : "; NOT teacher-forced at layers " + ranges(unforced);
        line += " (inputs not in the dump; docs/conform.md \"Thin dumps\")";
      }
      out.push_back(line);
    }
  }
  return out;
}

reports::RunReport conform(const PortDump& d, const reference::checkpoint::ModelWeights& weights,
                           const std::vector<int64_t>& token_map, const ConformOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const ConformTolerances tol = o.tolerances_file.empty() ? ConformTolerances{} : load_conform_tolerances(o.tolerances_file);
  const std::vector<ConformWaiver> waivers =
      o.tolerances_file.empty() ? std::vector<ConformWaiver>{} : load_conform_waivers(o.tolerances_file);
  parse_only(o.only);  // a bad --only is refused before any work
  reports::ScenarioResult s;
  s.name = o.name.empty() ? std::filesystem::path(d.dir).lexically_normal().filename().string() : o.name;
  if (s.name.empty() || s.name == "." || s.name == "..") s.name = "dump";
  s.kind = "conform";
  s.description = "a port's dump (docs/port-dump.md) judged against the reference, teacher-forced and end to end";
  s.source = d.dir;
  for (const PortDumpStep& st : d.steps) {
    if (o.stop_after_step >= 0 && st.index > o.stop_after_step) break;
    s.steps.push_back({st.index, 0, st.event, st.start_pos, static_cast<int64_t>(st.tokens.size()), {}});
  }
  const std::string thin = thin_reason(d, o.require);
  std::vector<StepJudgement> judged;
  if (!d.steps.empty() && (thin.empty() || d.steps.front().start_pos == 0)) judged = conform_detail::replay(d, weights, token_map, o);
  const ForcingMap forcing = teacher_forcing(d);
  std::vector<conform_detail::RootCauseGroup> roots;
  s.comparisons.push_back(judge(judged, true, d, tol, waivers, o, thin, forcing, &roots));
  if (o.end_to_end) {
    s.comparisons.push_back(judge(judged, false, d, tol, waivers, o, thin, forcing));
    reports::Comparison& e2e = s.comparisons.back();
    if (!o.require.empty() && thin.empty() && e2e.verdict == Verdict::kInconclusive && e2e.items_compared == 0) {
      // A partial port (--require) whose dump holds none of the end-to-end outputs (logits, selections,
      // caches): its evidence is the teacher-forced comparison; this one asserts nothing.
      e2e.verdict = Verdict::kMeasured;
      e2e.notes.push_back("nothing compared end to end: the dump holds none of its outputs (a partial port, --require); "
                          "the teacher-forced comparison judges what it holds");
    }
  }
  json sj;
  sj["dump"] = d.dir;
  sj["tool"] = d.tool;
  sj["tolerances_file"] = o.tolerances_file;
  json tj = json::object();
  for (const auto& [c, m] : tol) {
    for (const auto& [metric, t] : m) {
      tj[c][metric] = {{"bound", t.bound}, {"higher_is_better", t.higher_is_better}, {"origin", t.origin}, {"note", t.note}};
    }
  }
  sj["tolerances"] = tj;
  const bool ov = conform_detail::order_variant(d, o);
  sj["claim"] = ov ? kClaimOrderVariant : kClaimBitExact;
  sj["claim_source"] = o.order_variant ? "--order-variant" : "the dump's manifest";
  if (ov) {
    sj["accumulation"] = judge::name(conform_detail::accumulation(d, o));
    sj["accumulation_source"] = o.accumulation.empty() ? "the dump's manifest" : "--accumulation";
  }
  sj["default_tolerance"] = ov ? "derived bounds (scenarios/judge/derived_bounds.h), exact where the semantics are exact"
                               : kExactNote;
  if (ov) {
    json db = json::array();
    for (const judge::DerivedBound& b : judge::derived_bound_table(d.config, conform_detail::accumulation(d, o))) {
      db.push_back({{"component", b.component}, {"metric", judge::kRowRelMetric}, {"bound", b.bound}, {"n", b.n},
                    {"op", b.op}, {"precisions", b.precisions}, {"origin", b.origin},
                    {"overridden", tol.count(b.component) > 0 || tol.count("*") > 0}});
      const Tolerance g = judge::row_gain_tolerance(b);
      db.push_back({{"component", b.component}, {"metric", judge::kRowGainMetric}, {"bound", g.bound}, {"n", b.n},
                    {"op", b.op}, {"precisions", b.precisions}, {"origin", g.note},
                    {"overridden", tol.count(b.component) > 0 || tol.count("*") > 0}});
    }
    for (const judge::DerivedBound& b : judge::derived_cache_bound_table(d.config, conform_detail::accumulation(d, o))) {
      db.push_back({{"component", b.component}, {"metric", judge::kDecodedRowRelMetric}, {"bound", b.bound}, {"n", b.n},
                    {"op", b.op}, {"precisions", b.precisions}, {"origin", b.origin},
                    {"overridden", tol.count(b.component) > 0 || tol.count("*") > 0}});
    }
    sj["derived_bounds"] = db;
  }
  json cov = json::object();
  for (const auto& [c, layers] : d.components) cov[c] = layers;
  sj["covered"] = cov;
  sj["not_covered"] = d.not_covered;
  sj["support_matrix"] = support_matrix_lines(d);
  json tf = json::object();  // (component, layer) -> the inputs the dump lacks ([]: teacher-forced)
  for (const auto& [key, x] : forcing) tf[key.first][std::to_string(key.second)] = x.missing;
  sj["teacher_forcing"] = tf;
  json rj = json::array();  // the independent root causes of the teacher-forced comparison
  for (const conform_detail::RootCauseGroup& g : roots) {
    const conform_detail::Failure& f = g.first;
    rj.push_back({{"step", f.step}, {"layer", f.layer}, {"component", f.component}, {"metric", f.metric},
                  {"value", f.value}, {"bound", f.bound}, {"detail", f.detail}, {"repro", f.repro}, {"also_steps", g.also_steps}});
  }
  sj["root_causes"] = rj;
  sj["stop_after_step"] = o.stop_after_step;
  sj["only"] = o.only;
  s.scenario_json = sj.dump();
  s.verdict = judge::scenario_verdict(s.comparisons, &s.error);
  for (reports::Comparison& c : s.comparisons) {
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  reports::RunReport r;
  r.meta.config_name = d.dir + "/" + kPortDumpManifest;
  r.meta.config_hash = d.config_hash;
  r.meta.config_json = reference::to_json_string(d.config);
  r.meta.weights = d.weights;
  r.meta.sides = {"ref", "port"};
  r.scenarios.push_back(std::move(s));
  r.verdict = reports::roll_up(r.scenarios);
  return r;
}

std::optional<RootCause> root_cause(const reports::RunReport& report) {
  for (const char* mode : {kConformTeacherForced, kConformEndToEnd}) {
    for (const reports::ScenarioResult& s : report.scenarios) {
      for (const reports::Comparison& c : s.comparisons) {
        if (c.mode != mode || !c.first_divergence) continue;
        const reports::Divergence& dv = *c.first_divergence;
        return RootCause{c.mode, dv.step, dv.layer, dv.component, dv.metric, dv.value, dv.detail, dv.rerun};
      }
    }
  }
  return std::nullopt;
}

int conform_exit_code(const reports::RunReport& report) { return reports::exit_code(report.verdict); }

}  // namespace dsv41::scenarios::conform
