// reports/report_read.cc: read_report, a RunReport back from its HDF5 form
// (docs/report-schema.md). Every problem becomes a dsv41::Error naming the file and the object.
#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <new>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reports/h5_reader.h"
#include "reports/internal/report_layout.h"
#include "reports/internal/report_replay.h"
#include "reports/report.h"

namespace dsv41::reports {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  if (s.empty()) return parts;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return parts;
}

// The H5Reader with the report's conventions: required objects, verdict attributes, columns.
class Reader {
 public:
  explicit Reader(const std::string& path) : r_(path) {}

  const H5Reader& h5() const { return r_; }

  void need(const std::string& object, H5Reader::Kind kind) const {
    const H5Reader::Kind k = r_.kind(object);
    if (k == H5Reader::Kind::kMissing) DSV41_FAIL("'", r_.path(), "': required object '", object, "' is missing");
    if (k != kind) {
      DSV41_FAIL("'", r_.path(), "': '", object, "' is not a ", kind == H5Reader::Kind::kGroup ? "group" : "dataset");
    }
  }

  Verdict verdict(const std::string& object, const std::string& attr) const {
    const std::string s = r_.attr_string(object, attr);
    try {
      return parse_verdict(s);
    } catch (const Error& e) {
      DSV41_FAIL("'", r_.path(), "': ", object, ": attribute '", attr, "': ", e.what());
    }
  }

  Verdict verdict_value(const std::string& where, const std::string& s) const {
    try {
      return parse_verdict(s);
    } catch (const Error& e) {
      DSV41_FAIL("'", r_.path(), "': ", where, ": ", e.what());
    }
  }

  std::string one_string(const std::string& path) const {
    const std::vector<std::string> v = r_.read_strings(path);
    if (v.size() != 1) DSV41_FAIL("'", r_.path(), "': dataset '", path, "' holds ", v.size(), " strings, expected 1");
    return v[0];
  }

  // The column datasets of a table group, checked to exist and to have `rows` (or, when rows <
  // 0, the first column's) length; returns that length.
  int64_t check_columns(const std::string& group, const std::vector<layout::Column>& cols, int64_t rows = -1) const {
    need(group, H5Reader::Kind::kGroup);
    for (const layout::Column& c : cols) {
      const std::string p = group + "/" + c.name;
      need(p, H5Reader::Kind::kDataset);
      const H5Reader::DatasetInfo info = r_.dataset_info(p);
      if (info.dims.size() != 1) DSV41_FAIL("'", r_.path(), "': column '", p, "' is not 1-D");
      if (rows < 0) rows = info.dims[0];
      if (info.dims[0] != rows) {
        DSV41_FAIL("'", r_.path(), "': column '", p, "' has ", info.dims[0], " rows, the table ", rows);
      }
    }
    return rows;
  }

  // Members of a group named by numbers ("00", "01", ...), in numeric order.
  std::vector<std::string> numbered(const std::string& group) const {
    std::vector<std::pair<long, std::string>> items;
    for (const std::string& n : r_.children(group)) {
      if (n.empty() || !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }) || n.size() > 9) {
        DSV41_FAIL("'", r_.path(), "': '", group, "/", n, "' is not a numbered member (00, 01, ...)");
      }
      items.emplace_back(std::stol(n), n);
    }
    std::sort(items.begin(), items.end());
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].first != static_cast<long>(i)) {
        DSV41_FAIL("'", r_.path(), "': '", group, "' members are not numbered 0, 1, ... (", items[i].second, ")");
      }
    }
    std::vector<std::string> names;
    for (auto& [i, n] : items) names.push_back(n);
    return names;
  }

 private:
  H5Reader r_;
};

RunMeta read_meta(const Reader& rd) {
  const H5Reader& r = rd.h5();
  rd.need(layout::kMeta, H5Reader::Kind::kGroup);
  RunMeta m;
  m.config_name = r.attr_string(layout::kMeta, "config_name");
  m.config_hash = r.attr_string(layout::kMeta, "config_hash");
  m.weights = r.attr_string(layout::kMeta, "weights");
  m.weights_sha256 = r.attr_string(layout::kMeta, "weights_sha256");
  m.config_json = rd.one_string("/meta/config_json");
  m.sides = r.read_strings("/meta/sides");
  const std::vector<std::string> names = r.read_strings("/meta/seed_name");
  const std::vector<uint64_t> values = r.read_uints("/meta/seed_value");
  if (names.size() != values.size()) {
    DSV41_FAIL("'", r.path(), "': /meta/seed_name has ", names.size(), " rows, /meta/seed_value ", values.size());
  }
  for (size_t i = 0; i < names.size(); ++i) m.seeds[names[i]] = values[i];

  rd.need(layout::kVolatile, H5Reader::Kind::kGroup);
  m.tool_version = r.attr_string(layout::kVolatile, "tool_version");
  m.git_commit = r.attr_string(layout::kVolatile, "git_commit");
  m.command_line = r.attr_string(layout::kVolatile, "command_line");
  m.created_utc = r.attr_string(layout::kVolatile, "created_utc");
  m.host = r.attr_string(layout::kVolatile, "host");
  m.threads = static_cast<int>(r.attr_int(layout::kVolatile, "threads"));
  m.seconds = r.attr_double(layout::kVolatile, "seconds");
  return m;
}

std::vector<StepInfo> read_steps(const Reader& rd, const std::string& g) {
  const H5Reader& r = rd.h5();
  const int64_t n = rd.check_columns(g, layout::steps_columns());
  const std::vector<int64_t> step = r.read_ints(g + "/step"), session = r.read_ints(g + "/session"),
                             start = r.read_ints(g + "/start_pos"), tokens = r.read_ints(g + "/tokens");
  const std::vector<std::string> phase = r.read_strings(g + "/phase"), bounds = r.read_strings(g + "/boundaries");
  std::vector<StepInfo> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].step = step[i];
    out[i].session = static_cast<int>(session[i]);
    out[i].phase = phase[i];
    out[i].start_pos = start[i];
    out[i].tokens = tokens[i];
    out[i].boundaries = split(bounds[i], ',');
  }
  return out;
}

std::vector<MetricRow> read_metrics(const Reader& rd, const std::string& g) {
  const H5Reader& r = rd.h5();
  const int64_t n = rd.check_columns(g, layout::metrics_columns());
  const std::vector<int64_t> step = r.read_ints(g + "/step"), session = r.read_ints(g + "/session"),
                             position = r.read_ints(g + "/position"), layer = r.read_ints(g + "/layer"),
                             higher = r.read_ints(g + "/higher_is_better");
  const std::vector<std::string> component = r.read_strings(g + "/component"), metric = r.read_strings(g + "/metric"),
                                  origin = r.read_strings(g + "/origin"), note = r.read_strings(g + "/note"),
                                  verdict = r.read_strings(g + "/verdict");
  const std::vector<double> value = r.read_doubles(g + "/value"), bound = r.read_doubles(g + "/bound");
  std::vector<MetricRow> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {
    MetricRow& m = out[i];
    m.step = step[i];
    m.session = static_cast<int>(session[i]);
    m.position = position[i];
    m.layer = static_cast<int>(layer[i]);
    m.component = component[i];
    m.metric = metric[i];
    m.value = value[i];
    if (!origin[i].empty()) m.tolerance = Tolerance{bound[i], higher[i] != 0, origin[i], note[i]};
    m.verdict = rd.verdict_value(g + "/verdict row " + std::to_string(i), verdict[i]);
  }
  return out;
}

// A file written before the table existed has none: no speculative rounds (schema version 1
// allows it; docs/report-schema.md, "Versioning").
std::vector<AcceptanceRow> read_acceptance(const Reader& rd, const std::string& g) {
  const H5Reader& r = rd.h5();
  if (r.kind(g) == H5Reader::Kind::kMissing) return {};
  const int64_t n = rd.check_columns(g, layout::acceptance_columns());
  const auto ints = [&](const char* c) { return r.read_ints(g + "/" + c); };
  const auto doubles = [&](const char* c) { return r.read_doubles(g + "/" + c); };
  const std::vector<int64_t> step = ints("step"), session = ints("session"), start = ints("start_pos"),
                             proposed = ints("proposed"), verified = ints("verified"), accepted = ints("accepted"),
                             kept = ints("kept"), next = ints("next_token"), index = ints("draft_index"),
                             token = ints("draft_token"), realised = ints("realised");
  const std::vector<std::string> side = r.read_strings(g + "/side");
  const std::vector<double> confidence = doubles("confidence"), survival = doubles("predicted_survival"),
                            prob = doubles("accept_prob");
  std::vector<AcceptanceRow> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {
    AcceptanceRow& a = out[i];
    a.step = step[i];
    a.session = static_cast<int>(session[i]);
    a.side = side[i];
    a.start_pos = start[i];
    a.proposed = proposed[i];
    a.verified = verified[i];
    a.accepted = accepted[i];
    a.kept = kept[i];
    a.next_token = next[i];
    a.draft_index = index[i];
    a.draft_token = token[i];
    a.confidence = confidence[i];
    a.predicted_survival = survival[i];
    a.realised = static_cast<int>(realised[i]);
    a.accept_prob = prob[i];
  }
  return out;
}

StoredTensor read_tensor(const Reader& rd, const std::string& g) {
  const H5Reader& r = rd.h5();
  rd.need(g, H5Reader::Kind::kGroup);
  StoredTensor t;
  t.step = r.attr_int(g, "step");
  t.layer = static_cast<int>(r.attr_int(g, "layer"));
  t.component = r.attr_string(g, "component");
  t.side = r.attr_string(g, "side");
  t.logical_dtype = r.attr_string(g, "logical_dtype");
  t.shape = r.attr_ints(g, "shape");
  const std::string p = g + "/values";
  if (t.logical_dtype == "bf16") {
    for (uint16_t b : r.read_u16(p)) t.values.push_back(formats::bf16_decode(b));
  } else {
    t.values = r.read_doubles(p);
  }
  int64_t n = 1;
  for (int64_t d : t.shape) {
    // A corrupt shape attribute must not overflow the product.
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) {
      DSV41_FAIL("'", r.path(), "': ", g, ": shape attribute has a negative or overflowing dimension ", d);
    }
    n *= d;
  }
  if (n != static_cast<int64_t>(t.values.size())) {
    DSV41_FAIL("'", r.path(), "': ", p, " holds ", t.values.size(), " values, its shape attribute ", n);
  }
  return t;
}

Comparison read_comparison(const Reader& rd, const std::string& g, bool load_tensors) {
  const H5Reader& r = rd.h5();
  rd.need(g, H5Reader::Kind::kGroup);
  Comparison c;
  c.side_a = r.attr_string(g, "side_a");
  c.side_b = r.attr_string(g, "side_b");
  c.mode = r.attr_string(g, "mode");
  c.expectation = r.attr_string(g, "expectation");
  c.expectation_origin = r.attr_string(g, "expectation_origin");
  c.verdict = rd.verdict(g, "verdict");
  c.steps_compared = r.attr_int(g, "steps_compared");
  c.items_compared = r.attr_int(g, "items_compared");
  c.notes = r.read_strings(g + "/notes");
  const std::string f = g + "/first_divergence";
  if (r.kind(f) != H5Reader::Kind::kMissing) {
    rd.need(f, H5Reader::Kind::kGroup);
    Divergence d;
    d.step = r.attr_int(f, "step");
    d.session = static_cast<int>(r.attr_int(f, "session"));
    d.position = r.attr_int(f, "position");
    d.layer = static_cast<int>(r.attr_int(f, "layer"));
    d.component = r.attr_string(f, "component");
    d.metric = r.attr_string(f, "metric");
    d.value = r.attr_double(f, "value");
    d.tolerance.bound = r.attr_double(f, "bound");
    d.tolerance.higher_is_better = r.attr_int(f, "higher_is_better") != 0;
    d.tolerance.origin = r.attr_string(f, "origin");
    d.tolerance.note = r.attr_string(f, "note");
    d.detail = r.attr_string(f, "detail");
    d.rerun = r.attr_string(f, "rerun");
    c.first_divergence = d;
  }
  c.rows = read_metrics(rd, g + "/metrics");
  c.acceptance = read_acceptance(rd, g + "/acceptance");
  rd.need(g + "/tensors", H5Reader::Kind::kGroup);
  if (load_tensors) {
    for (const std::string& k : rd.numbered(g + "/tensors")) c.tensors.push_back(read_tensor(rd, g + "/tensors/" + k));
  }
  return c;
}

ScenarioResult read_scenario(const Reader& rd, const std::string& name, bool load_tensors) {
  const H5Reader& r = rd.h5();
  const std::string g = layout::scenario_path(name);
  ScenarioResult s;
  s.name = name;
  s.kind = r.attr_string(g, "kind");
  s.description = r.attr_string(g, "description");
  s.source = r.attr_string(g, "source");
  s.seed = r.attr_uint(g, "seed");
  s.verdict = rd.verdict(g, "verdict");
  s.error = r.attr_string(g, "error");
  s.scenario_json = rd.one_string(g + "/scenario_json");
  s.steps = read_steps(rd, g + "/steps");
  rd.need(g + "/comparisons", H5Reader::Kind::kGroup);
  for (const std::string& c : rd.numbered(g + "/comparisons")) {
    s.comparisons.push_back(read_comparison(rd, g + "/comparisons/" + c, load_tensors));
  }
  return s;
}

RunReport read_all(const std::string& path, bool load_tensors) {
  const Reader rd(path);
  const H5Reader& r = rd.h5();
  if (r.attr_type("/", "schema") != H5Reader::Type::kString || r.attr_string("/", "schema") != layout::kSchema) {
    DSV41_FAIL("'", path, "': not a dsv41 divergence report (the root attribute 'schema' is not '", layout::kSchema,
               "')");
  }
  const int64_t version = r.attr_int("/", "schema_version");
  if (version != layout::kSchemaVersion) {
    DSV41_FAIL("'", path, "': schema_version ", version, " is not supported (this build reads version ",
               layout::kSchemaVersion, ")");
  }
  RunReport report;
  report.verdict = rd.verdict("/", "verdict");
  report.meta = read_meta(rd);
  rd.need(layout::kSummary, H5Reader::Kind::kDataset);
  rd.need(layout::kScenarios, H5Reader::Kind::kGroup);

  // Scenarios in run order (their "index" attribute).
  std::vector<std::pair<int64_t, std::string>> order;
  for (const std::string& n : r.children(layout::kScenarios)) {
    order.emplace_back(r.attr_int(layout::scenario_path(n), "index"), n);
  }
  std::sort(order.begin(), order.end());
  for (const auto& [i, n] : order) report.scenarios.push_back(read_scenario(rd, n, load_tensors));

  // Wall times (volatile).
  const std::string wt = layout::kWallTimes;
  rd.check_columns(wt, layout::wall_time_columns());
  const std::vector<std::string> scen = r.read_strings(wt + "/scenario");
  const std::vector<int64_t> index = r.read_ints(wt + "/comparison");
  const std::vector<double> seconds = r.read_doubles(wt + "/seconds");
  std::map<std::pair<std::string, int64_t>, double> wall;
  for (size_t i = 0; i < scen.size(); ++i) wall[{scen[i], index[i]}] = seconds[i];
  for (ScenarioResult& s : report.scenarios) {
    for (size_t c = 0; c < s.comparisons.size(); ++c) {
      const auto it = wall.find({s.name, static_cast<int64_t>(c)});
      if (it != wall.end()) s.comparisons[c].seconds = it->second;
    }
  }
  read_replay_tables(r, report);
  return report;
}

}  // namespace

RunReport read_report(const std::string& path, bool load_tensors) {
  try {
    return read_all(path, load_tensors);
  } catch (const Error&) {
    throw;  // names the file already
  } catch (const std::bad_alloc&) {
    DSV41_FAIL("'", path, "': out of memory while reading the report (corrupt sizes?)");
  } catch (const std::exception& e) {
    DSV41_FAIL("'", path, "': cannot read the report: ", e.what());
  }
}

}  // namespace dsv41::reports
