// reports/report_write.cc: write_report, the HDF5 form of a RunReport (docs/report-schema.md).
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reports/h5_writer.h"
#include "reports/internal/report_items.h"
#include "reports/internal/report_layout.h"
#include "reports/internal/report_replay.h"
#include "reports/report.h"

namespace dsv41::reports {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
  return s;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Checks a tensor's values fit its logical dtype exactly; `where` names it in errors.
void check_tensor(const StoredTensor& t, const std::string& where) {
  for (int64_t d : t.shape) DSV41_CHECK(d >= 0, where, ": negative dimension in shape");
  DSV41_CHECK(element_count(t.shape) == static_cast<int64_t>(t.values.size()), where, ": ", t.values.size(),
              " values for a shape of ", element_count(t.shape), " elements");
  DSV41_CHECK(t.side == "a" || t.side == "b", where, ": side must be \"a\" or \"b\", got '", t.side, "'");
  for (size_t i = 0; i < t.values.size(); ++i) {
    const double v = t.values[i];
    bool fits = true;
    if (t.logical_dtype == "fp32") {
      fits = std::isnan(v) || static_cast<double>(static_cast<float>(v)) == v;
    } else if (t.logical_dtype == "bf16") {
      fits = std::isnan(v) || (static_cast<double>(static_cast<float>(v)) == v &&
                               formats::bf16_decode(formats::bf16_encode(static_cast<float>(v))) == static_cast<float>(v));
    } else if (t.logical_dtype == "int32") {
      fits = v == std::trunc(v) && v >= INT32_MIN && v <= INT32_MAX;
    } else if (t.logical_dtype == "int64") {
      fits = v == std::trunc(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    } else if (t.logical_dtype == "uint8") {
      fits = v == std::trunc(v) && v >= 0 && v <= 255;
    } else {
      DSV41_FAIL(where, ": unknown logical_dtype '", t.logical_dtype, "' (bf16, fp32, int32, int64, uint8)");
    }
    DSV41_CHECK(fits, where, ": value ", i, " (", v, ") is not a ", t.logical_dtype, " value");
  }
}

// Everything write_report refuses, checked before the file is touched.
void validate(const RunReport& report) {
  std::set<std::string> names;
  for (const ScenarioResult& s : report.scenarios) {
    check_scenario_name(s.name);
    if (!names.insert(s.name).second) DSV41_FAIL("report: duplicate scenario name '", s.name, "'");
    for (const StepInfo& st : s.steps) {
      for (const std::string& b : st.boundaries) {
        DSV41_CHECK(b.find(',') == std::string::npos && !b.empty(), "report: scenario '", s.name, "' step ", st.step,
                    ": boundary '", b, "' is empty or contains ','");
      }
    }
    for (size_t c = 0; c < s.comparisons.size(); ++c) {
      const Comparison& cmp = s.comparisons[c];
      const std::string where = "report: scenario '" + s.name + "' comparison " + std::to_string(c);
      for (size_t i = 0; i < cmp.rows.size(); ++i) {
        const MetricRow& m = cmp.rows[i];
        DSV41_CHECK(!m.tolerance || !m.tolerance->origin.empty(), where, " row ", i, " (", m.component, " ",
                    m.metric, "): a tolerance without an origin");
      }
      for (size_t i = 0; i < cmp.acceptance.size(); ++i) {
        const AcceptanceRow& a = cmp.acceptance[i];
        DSV41_CHECK(a.side == "a" || a.side == "b", where, " acceptance row ", i, " (step ", a.step,
                    "): side must be \"a\" or \"b\", got '", a.side, "'");
        DSV41_CHECK(a.draft_index >= -1, where, " acceptance row ", i, " (step ", a.step, "): draft_index ",
                    a.draft_index, " is below -1");
        DSV41_CHECK(a.realised >= -1 && a.realised <= 1, where, " acceptance row ", i, " (step ", a.step,
                    "): realised ", a.realised, " is not -1, 0 or 1");
      }
      if (cmp.first_divergence) {
        DSV41_CHECK(!cmp.first_divergence->tolerance.origin.empty(), where,
                    ": the first divergence's tolerance has no origin");
      }
      for (size_t k = 0; k < cmp.tensors.size(); ++k) check_tensor(cmp.tensors[k], where + " tensor " + std::to_string(k));
    }
  }
}

void write_meta(H5Writer& w, const RunReport& r) {
  const RunMeta& m = r.meta;
  w.group(layout::kMeta);
  w.text_attr(layout::kMeta, "config_name", m.config_name);
  w.text_attr(layout::kMeta, "config_hash", m.config_hash);
  w.text_attr(layout::kMeta, "weights", m.weights);
  w.text_attr(layout::kMeta, "weights_sha256", m.weights_sha256);
  w.write_strings("/meta/config_json", {m.config_json});
  w.write_strings("/meta/sides", m.sides);
  std::vector<std::string> seed_names;
  std::vector<uint64_t> seed_values;
  for (const auto& [k, v] : m.seeds) {
    seed_names.push_back(k);
    seed_values.push_back(v);
  }
  w.write_strings("/meta/seed_name", seed_names);
  w.write("/meta/seed_value", seed_values, {static_cast<int64_t>(seed_values.size())});

  // Everything that changes between two runs of the same command.
  w.group(layout::kVolatile);
  w.text_attr(layout::kVolatile, "tool_version", m.tool_version);
  w.text_attr(layout::kVolatile, "git_commit", m.git_commit);
  w.text_attr(layout::kVolatile, "command_line", m.command_line);
  w.text_attr(layout::kVolatile, "created_utc", m.created_utc);
  w.text_attr(layout::kVolatile, "host", m.host);
  w.attr(layout::kVolatile, "threads", static_cast<int64_t>(m.threads));
  w.attr(layout::kVolatile, "seconds", m.seconds);
  std::vector<std::string> scen;
  std::vector<int64_t> index;
  std::vector<double> seconds;
  for (const ScenarioResult& s : r.scenarios) {
    for (size_t c = 0; c < s.comparisons.size(); ++c) {
      scen.push_back(s.name);
      index.push_back(static_cast<int64_t>(c));
      seconds.push_back(s.comparisons[c].seconds);
    }
  }
  w.write_columns(layout::kWallTimes, {{"scenario", scen}, {"comparison", index}, {"seconds", seconds}});
  write_items(w, m.items);  // a sweep's work items (reports/internal/report_items.h)
  write_replay_tables(w, r);  // sampled replay and per-side measures (reports/internal/report_replay.h)
}

void write_summary(H5Writer& w, const RunReport& r) {
  std::vector<std::string> scenario, side_a, side_b, mode, component, metric, origin, verdict;
  std::vector<int64_t> comparison, step, layer, rows;
  std::vector<double> value, bound;
  std::vector<uint8_t> higher;
  for (const SummaryRow& s : summarize(r)) {
    scenario.push_back(s.scenario);
    comparison.push_back(s.comparison);
    side_a.push_back(s.side_a);
    side_b.push_back(s.side_b);
    mode.push_back(s.mode);
    component.push_back(s.component);
    metric.push_back(s.metric);
    value.push_back(s.value);
    step.push_back(s.step);
    layer.push_back(s.layer);
    bound.push_back(s.bound);
    higher.push_back(s.higher_is_better ? 1 : 0);
    origin.push_back(s.origin);
    verdict.push_back(name(s.verdict));
    rows.push_back(s.rows);
  }
  // The order of layout::summary_columns().
  w.write_table(layout::kSummary, {{"scenario", scenario}, {"comparison", comparison}, {"side_a", side_a},
                                   {"side_b", side_b}, {"mode", mode}, {"component", component},
                                   {"metric", metric}, {"value", value}, {"step", step}, {"layer", layer},
                                   {"bound", bound}, {"higher_is_better", higher}, {"origin", origin},
                                   {"verdict", verdict}, {"rows", rows}});
}

void write_steps(H5Writer& w, const std::string& group, const std::vector<StepInfo>& steps) {
  std::vector<int64_t> step, session, start_pos, tokens;
  std::vector<std::string> phase, boundaries;
  for (const StepInfo& s : steps) {
    step.push_back(s.step);
    session.push_back(s.session);
    phase.push_back(s.phase);
    start_pos.push_back(s.start_pos);
    tokens.push_back(s.tokens);
    boundaries.push_back(join(s.boundaries, ","));
  }
  w.write_columns(group, {{"step", step}, {"session", session}, {"phase", phase}, {"start_pos", start_pos},
                          {"tokens", tokens}, {"boundaries", boundaries}});
}

void write_metrics(H5Writer& w, const std::string& group, const std::vector<MetricRow>& rows) {
  std::vector<int64_t> step, session, position, layer;
  std::vector<std::string> component, metric, origin, note, verdict;
  std::vector<double> value, bound;
  std::vector<uint8_t> higher;
  for (const MetricRow& m : rows) {
    step.push_back(m.step);
    session.push_back(m.session);
    position.push_back(m.position);
    layer.push_back(m.layer);
    component.push_back(m.component);
    metric.push_back(m.metric);
    value.push_back(m.value);
    bound.push_back(m.tolerance ? m.tolerance->bound : kNaN);
    higher.push_back(m.tolerance && m.tolerance->higher_is_better ? 1 : 0);
    origin.push_back(m.tolerance ? m.tolerance->origin : "");
    note.push_back(m.tolerance ? m.tolerance->note : "");
    verdict.push_back(name(m.verdict));
  }
  w.write_columns(group, {{"step", step}, {"session", session}, {"position", position}, {"layer", layer},
                          {"component", component}, {"metric", metric}, {"value", value}, {"bound", bound},
                          {"higher_is_better", higher}, {"origin", origin}, {"note", note}, {"verdict", verdict}});
}

// Written even without rows (zero-length columns), like steps/ and metrics/.
void write_acceptance(H5Writer& w, const std::string& group, const std::vector<AcceptanceRow>& rows) {
  std::vector<int64_t> step, session, start_pos, proposed, verified, accepted, kept, next_token, draft_index,
      draft_token, realised;
  std::vector<std::string> side;
  std::vector<double> confidence, survival, accept_prob;
  for (const AcceptanceRow& a : rows) {
    step.push_back(a.step);
    session.push_back(a.session);
    side.push_back(a.side);
    start_pos.push_back(a.start_pos);
    proposed.push_back(a.proposed);
    verified.push_back(a.verified);
    accepted.push_back(a.accepted);
    kept.push_back(a.kept);
    next_token.push_back(a.next_token);
    draft_index.push_back(a.draft_index);
    draft_token.push_back(a.draft_token);
    confidence.push_back(a.confidence);
    survival.push_back(a.predicted_survival);
    realised.push_back(a.realised);
    accept_prob.push_back(a.accept_prob);
  }
  // The order of layout::acceptance_columns().
  w.write_columns(group, {{"step", step}, {"session", session}, {"side", side}, {"start_pos", start_pos},
                          {"proposed", proposed}, {"verified", verified}, {"accepted", accepted}, {"kept", kept},
                          {"next_token", next_token}, {"draft_index", draft_index}, {"draft_token", draft_token},
                          {"confidence", confidence}, {"predicted_survival", survival}, {"realised", realised},
                          {"accept_prob", accept_prob}});
}

void write_tensor(H5Writer& w, const std::string& g, const StoredTensor& t) {
  w.group(g);
  w.attr(g, "step", static_cast<int64_t>(t.step));
  w.attr(g, "layer", static_cast<int64_t>(t.layer));
  w.text_attr(g, "component", t.component);
  w.text_attr(g, "side", t.side);
  w.text_attr(g, "logical_dtype", t.logical_dtype);
  w.attr(g, "shape", t.shape);
  // Stored with its shape (a rank-0 tensor as one element); chunked + gzip.
  const std::vector<int64_t> shape = t.shape.empty() ? std::vector<int64_t>{1} : t.shape;
  const std::string p = g + "/values";
  w.set_compress_above(0);
  const auto convert = [&t](auto zero) {
    std::vector<decltype(zero)> v;
    v.reserve(t.values.size());
    for (double x : t.values) v.push_back(static_cast<decltype(zero)>(x));
    return v;
  };
  if (t.logical_dtype == "bf16") {
    std::vector<uint16_t> bits;
    for (double x : t.values) bits.push_back(formats::bf16_encode(static_cast<float>(x)));
    w.write(p, bits, shape);
  } else if (t.logical_dtype == "fp32") {
    w.write(p, convert(0.0f), shape);
  } else if (t.logical_dtype == "int32") {
    w.write(p, convert(int32_t{0}), shape);
  } else if (t.logical_dtype == "int64") {
    w.write(p, convert(int64_t{0}), shape);
  } else {
    w.write(p, convert(uint8_t{0}), shape);
  }
  w.set_compress_above(64 * 1024);
}

void write_comparison(H5Writer& w, const std::string& g, const Comparison& c) {
  w.group(g);
  w.text_attr(g, "side_a", c.side_a);
  w.text_attr(g, "side_b", c.side_b);
  w.text_attr(g, "mode", c.mode);
  w.text_attr(g, "expectation", c.expectation);
  w.text_attr(g, "expectation_origin", c.expectation_origin);
  w.text_attr(g, "verdict", name(c.verdict));
  w.attr(g, "steps_compared", static_cast<int64_t>(c.steps_compared));
  w.attr(g, "items_compared", static_cast<int64_t>(c.items_compared));
  w.write_strings(g + "/notes", c.notes);
  if (c.first_divergence) {
    const Divergence& d = *c.first_divergence;
    const std::string f = g + "/first_divergence";
    w.group(f);
    w.attr(f, "step", static_cast<int64_t>(d.step));
    w.attr(f, "session", static_cast<int64_t>(d.session));
    w.attr(f, "position", static_cast<int64_t>(d.position));
    w.attr(f, "layer", static_cast<int64_t>(d.layer));
    w.text_attr(f, "component", d.component);
    w.text_attr(f, "metric", d.metric);
    w.attr(f, "value", d.value);
    w.attr(f, "bound", d.tolerance.bound);
    w.attr(f, "higher_is_better", static_cast<int64_t>(d.tolerance.higher_is_better ? 1 : 0));
    w.text_attr(f, "origin", d.tolerance.origin);
    w.text_attr(f, "note", d.tolerance.note);
    w.text_attr(f, "detail", d.detail);
    w.text_attr(f, "rerun", d.rerun);
  }
  write_metrics(w, g + "/metrics", c.rows);
  write_acceptance(w, g + "/acceptance", c.acceptance);
  w.group(g + "/tensors");
  for (size_t k = 0; k < c.tensors.size(); ++k) write_tensor(w, g + "/tensors/" + layout::index_name(k), c.tensors[k]);
}

void write_scenario(H5Writer& w, size_t index, const ScenarioResult& s) {
  const std::string g = layout::scenario_path(s.name);
  w.group(g);
  w.attr(g, "index", static_cast<int64_t>(index));
  w.text_attr(g, "kind", s.kind);
  w.text_attr(g, "description", s.description);
  w.text_attr(g, "source", s.source);
  w.attr(g, "seed", s.seed);
  w.text_attr(g, "verdict", name(s.verdict));
  w.text_attr(g, "error", s.error);
  w.write_strings(g + "/scenario_json", {s.scenario_json});
  write_steps(w, g + "/steps", s.steps);
  w.group(g + "/comparisons");
  for (size_t c = 0; c < s.comparisons.size(); ++c) {
    write_comparison(w, g + "/comparisons/" + layout::index_name(c), s.comparisons[c]);
  }
}

}  // namespace

void check_scenario_name(const std::string& name) {
  if (name.empty()) DSV41_FAIL("report: a scenario has an empty name");
  if (name.find('/') != std::string::npos || name == "." || name == "..") {
    DSV41_FAIL("report: scenario name '", name, "' is not a valid HDF5 group name (no '/', not '.' or '..')");
  }
}

void write_report(const std::string& path, const RunReport& report) {
  validate(report);
  validate_items(report);
  H5Writer w(path, "report");
  w.text_attr("/", "schema", layout::kSchema);
  w.attr("/", "schema_version", layout::kSchemaVersion);
  w.text_attr("/", "verdict", name(report.verdict));
  w.attr("/", "exit_code", static_cast<int64_t>(exit_code(report.verdict)));
  write_meta(w, report);
  write_summary(w, report);
  w.group(layout::kScenarios);
  for (size_t i = 0; i < report.scenarios.size(); ++i) write_scenario(w, i, report.scenarios[i]);
  w.commit();
}

}  // namespace dsv41::reports
