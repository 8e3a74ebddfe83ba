// reports/report_schema.cc: check_report_schema, every problem of a file against
// docs/report-schema.md (schema_version 1): objects, attributes and their types, column lengths,
// verdict names, and the consistency of the stored verdicts. The acceptance/ table is optional
// (files written before it existed lack it); when present it is checked like the others.
#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "reports/h5_reader.h"
#include "reports/internal/report_items.h"
#include "reports/internal/report_replay.h"
#include "reports/internal/report_layout.h"
#include "reports/report.h"

namespace dsv41::reports {
namespace {

using Kind = H5Reader::Kind;
using Type = H5Reader::Type;

bool accepts(char kind, Type t) {
  switch (kind) {
    case 's': return t == Type::kString;
    case 'f': return t == Type::kFloat;
    case 'i':
    case 'u':
    case 'b': return t == Type::kInt || t == Type::kUInt;
  }
  return false;
}

const char* kind_name(char kind) {
  switch (kind) {
    case 's': return "strings";
    case 'f': return "floats";
    case 'b': return "0/1 flags";
    default: return "integers";
  }
}

std::optional<Verdict> verdict_of(const std::string& s) {
  for (Verdict v : {Verdict::kPass, Verdict::kFail, Verdict::kMeasured, Verdict::kInconclusive, Verdict::kError}) {
    if (s == name(v)) return v;
  }
  return std::nullopt;
}

// Collects the problems; every check reads defensively and records instead of throwing.
class Checker {
 public:
  explicit Checker(const H5Reader& r) : r_(r) {}

  std::vector<std::string> problems;

  void add(const std::string& where, const std::string& what) { problems.push_back(where + ": " + what); }

  // Runs fn; a dsv41::Error it throws becomes a problem of `where`.
  template <typename Fn>
  void guarded(const std::string& where, Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      add(where, e.what());
    }
  }

  bool group(const std::string& p) {
    const Kind k = r_.kind(p);
    if (k == Kind::kGroup) return true;
    add(p, k == Kind::kMissing ? "missing (a group)" : "is not a group");
    return false;
  }

  bool dataset(const std::string& p) {
    const Kind k = r_.kind(p);
    if (k == Kind::kDataset) return true;
    add(p, k == Kind::kMissing ? "missing (a dataset)" : "is not a dataset");
    return false;
  }

  // Attribute `name` of `obj` exists, is a scalar and has the kind ('s', 'i', 'u', 'f', 'b').
  bool attr(const std::string& obj, const std::string& name, char kind) {
    const Type t = r_.attr_type(obj, name);
    if (t == Type::kNone) {
      add(obj, "attribute '" + name + "' is missing");
      return false;
    }
    if (!accepts(kind, t) && !(kind == 'f' && (t == Type::kInt || t == Type::kUInt))) {
      add(obj, "attribute '" + name + "' should hold " + kind_name(kind));
      return false;
    }
    bool ok = true;
    guarded(obj, [&] {
      if (r_.attr_size(obj, name) != 1) {
        add(obj, "attribute '" + name + "' is not a scalar");
        ok = false;
      }
    });
    return ok;
  }

  std::optional<std::string> string_attr(const std::string& obj, const std::string& name) {
    if (!attr(obj, name, 's')) return std::nullopt;
    std::optional<std::string> v;
    guarded(obj, [&] { v = r_.attr_string(obj, name); });
    return v;
  }

  std::optional<Verdict> verdict_attr(const std::string& obj) {
    const std::optional<std::string> s = string_attr(obj, "verdict");
    if (!s) return std::nullopt;
    const std::optional<Verdict> v = verdict_of(*s);
    if (!v) add(obj, "attribute 'verdict' is '" + *s + "', not pass, fail, measured, inconclusive or error");
    return v;
  }

  // A 1-D string dataset; its length when it is one.
  std::optional<int64_t> strings(const std::string& p) {
    if (!dataset(p)) return std::nullopt;
    std::optional<int64_t> n;
    guarded(p, [&] {
      const H5Reader::DatasetInfo info = r_.dataset_info(p);
      if (info.type != Type::kString) {
        add(p, "should hold strings");
      } else if (info.dims.size() != 1) {
        add(p, "should be 1-D");
      } else {
        n = info.dims[0];
      }
    });
    return n;
  }

  // A group of 1-D column datasets of one length, with the kinds of `cols`; the length, when
  // every column is there with its kind.
  std::optional<int64_t> columns(const std::string& g, const std::vector<layout::Column>& cols) {
    if (!group(g)) return std::nullopt;
    std::optional<int64_t> rows;
    bool ok = true;
    for (const layout::Column& c : cols) {
      const std::string p = g + "/" + c.name;
      if (!dataset(p)) {
        ok = false;
        continue;
      }
      guarded(p, [&] {
        const H5Reader::DatasetInfo info = r_.dataset_info(p);
        if (!accepts(c.kind, info.type)) {
          add(p, std::string("should hold ") + kind_name(c.kind));
          ok = false;
        }
        if (info.dims.size() != 1) {
          add(p, "should be 1-D");
          ok = false;
          return;
        }
        if (!rows) rows = info.dims[0];
        if (info.dims[0] != *rows) {
          add(p, "has " + std::to_string(info.dims[0]) + " rows, the other columns of " + g + " " +
                     std::to_string(*rows));
          ok = false;
        }
      });
    }
    return ok ? rows : std::nullopt;
  }

  // Verdict names of a string column; the verdicts when all are valid.
  std::optional<std::vector<Verdict>> verdict_column(const std::string& where, const std::vector<std::string>& v) {
    std::vector<Verdict> out;
    bool ok = true;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::optional<Verdict> x = verdict_of(v[i]);
      if (!x) {
        add(where, "row " + std::to_string(i) + ": '" + v[i] + "' is not a verdict");
        ok = false;
      } else {
        out.push_back(*x);
      }
    }
    return ok ? std::optional(out) : std::nullopt;
  }

  const H5Reader& r() const { return r_; }

 private:
  const H5Reader& r_;
};

void check_meta(Checker& c) {
  if (c.group(layout::kMeta)) {
    for (const char* a : layout::meta_string_attrs()) c.attr(layout::kMeta, a, 's');
    if (const auto n = c.strings("/meta/config_json"); n && *n != 1) c.add("/meta/config_json", "should hold 1 string");
    c.strings("/meta/sides");
    const auto names = c.strings("/meta/seed_name");
    if (c.dataset("/meta/seed_value")) {
      c.guarded("/meta/seed_value", [&] {
        const H5Reader::DatasetInfo info = c.r().dataset_info("/meta/seed_value");
        if (!accepts('u', info.type) || info.dims.size() != 1) {
          c.add("/meta/seed_value", "should be 1-D integers");
        } else if (names && info.dims[0] != *names) {
          c.add("/meta/seed_value", "has " + std::to_string(info.dims[0]) + " rows, /meta/seed_name " +
                                        std::to_string(*names));
        }
      });
    }
  }
  if (c.group(layout::kVolatile)) {
    for (const char* a : layout::volatile_string_attrs()) c.attr(layout::kVolatile, a, 's');
    c.attr(layout::kVolatile, "threads", 'i');
    c.attr(layout::kVolatile, "seconds", 'f');
    c.columns(layout::kWallTimes, layout::wall_time_columns());
  }
}

// A sweep's work-item tables (optional: only a sweep writes them): both present or both absent,
// one length, the same items in the same order, each naming a scenario of the file, once.
void check_items(Checker& c) {
  const bool stable = c.r().kind(layout::kItems) != H5Reader::Kind::kMissing;
  const bool vol = c.r().kind(layout::kVolatileItems) != H5Reader::Kind::kMissing;
  if (!stable && !vol) return;
  const auto n = c.columns(layout::kItems, layout::item_columns());
  const auto m = c.columns(layout::kVolatileItems, layout::volatile_item_columns());
  if (!n || !m) return;
  c.guarded(layout::kItems, [&] {
    const std::vector<std::string> items = c.r().read_strings(std::string(layout::kItems) + "/item");
    const std::vector<std::string> vitems = c.r().read_strings(std::string(layout::kVolatileItems) + "/item");
    if (items != vitems) c.add(layout::kVolatileItems, "its item column differs from /meta/items/item");
    std::set<std::string> seen;
    for (const std::string& i : items) {
      if (!seen.insert(i).second) c.add(layout::kItems, "item '" + i + "' appears twice");
      if (i.empty() || i.find('/') != std::string::npos ||
          c.r().kind(layout::scenario_path(i)) != H5Reader::Kind::kGroup) {
        c.add(layout::kItems, "item '" + i + "' is not a scenario of the file");
      }
    }
  });
}

// The sampled-replay and per-side tables (optional: reports/internal/report_replay.h).
void check_replay_tables(Checker& c) {
  if (c.r().kind(kReplayTable) != H5Reader::Kind::kMissing) c.columns(kReplayTable, replay_columns());
  if (c.r().kind(kSidesTable) != H5Reader::Kind::kMissing) c.columns(kSidesTable, side_columns());
}

// Returns, per (scenario, comparison), the number of metric rows the summary aggregates.
std::map<std::pair<std::string, int64_t>, int64_t> check_summary(Checker& c) {
  std::map<std::pair<std::string, int64_t>, int64_t> rows;
  const std::string p = layout::kSummary;
  if (!c.dataset(p)) return rows;
  c.guarded(p, [&] {
    const H5Reader::DatasetInfo info = c.r().dataset_info(p);
    if (info.type != Type::kCompound || info.dims.size() != 1) {
      c.add(p, "should be a 1-D compound dataset (one row per scenario, comparison, component, metric)");
      return;
    }
    bool ok = true;
    for (const layout::Column& col : layout::summary_columns()) {
      const auto it = std::find_if(info.fields.begin(), info.fields.end(),
                                   [&](const auto& f) { return f.first == col.name; });
      if (it == info.fields.end()) {
        c.add(p, std::string("column '") + col.name + "' is missing");
        ok = false;
      } else if (!accepts(col.kind, it->second)) {
        c.add(p, std::string("column '") + col.name + "' should hold " + kind_name(col.kind));
        ok = false;
      }
    }
    if (!ok) return;
    c.verdict_column(p + " column 'verdict'", c.r().read_field_strings(p, "verdict"));
    const std::vector<std::string> scen = c.r().read_field_strings(p, "scenario");
    const std::vector<int64_t> cmp = c.r().read_field_ints(p, "comparison");
    const std::vector<int64_t> n = c.r().read_field_ints(p, "rows");
    for (size_t i = 0; i < scen.size(); ++i) rows[{scen[i], cmp[i]}] += n[i];
  });
  return rows;
}

// Checks one comparison; returns its verdict when readable.
std::optional<Verdict> check_comparison(Checker& c, const std::string& g, int64_t summary_rows) {
  if (!c.group(g)) return std::nullopt;
  for (const char* a : layout::comparison_string_attrs()) {
    if (std::string(a) != "verdict") c.attr(g, a, 's');
  }
  const std::optional<Verdict> verdict = c.verdict_attr(g);
  c.attr(g, "steps_compared", 'i');
  c.attr(g, "items_compared", 'i');
  c.strings(g + "/notes");
  const std::string f = g + "/first_divergence";
  const bool has_divergence = c.r().kind(f) != Kind::kMissing;
  if (has_divergence && c.group(f)) {
    for (const char* a : {"step", "session", "position", "layer", "higher_is_better"}) c.attr(f, a, 'i');
    for (const char* a : {"value", "bound"}) c.attr(f, a, 'f');
    for (const char* a : layout::divergence_string_attrs()) c.attr(f, a, 's');
  }
  const std::string m = g + "/metrics";
  if (const std::optional<int64_t> n = c.columns(m, layout::metrics_columns())) {
    if (*n != summary_rows) {
      c.add(m, std::to_string(*n) + " rows, but /summary aggregates " + std::to_string(summary_rows) +
                   " rows of this comparison");
    }
    c.guarded(m, [&] {
      const std::vector<std::string> origin = c.r().read_strings(m + "/origin");
      const std::vector<double> value = c.r().read_doubles(m + "/value"), bound = c.r().read_doubles(m + "/bound");
      const std::vector<int64_t> higher = c.r().read_ints(m + "/higher_is_better");
      const auto rows = c.verdict_column(m + "/verdict", c.r().read_strings(m + "/verdict"));
      if (!rows) return;
      size_t failing = 0, checked_rows = 0;
      for (size_t i = 0; i < rows->size(); ++i) {
        const Verdict v = (*rows)[i];
        const bool checked = i < origin.size() && !origin[i].empty();
        checked_rows += checked;
        if (checked && v != Verdict::kPass && v != Verdict::kFail) {
          c.add(m, "row " + std::to_string(i) + ": a checked row (origin '" + origin[i] + "') has verdict '" +
                       name(v) + "', expected pass or fail");
        }
        // A checked row's verdict follows from its value and bound (reports::excess; NaN is
        // never within): a pass beyond its bound, or a fail within it, contradicts itself.
        if (checked && (v == Verdict::kPass || v == Verdict::kFail) && i < value.size() && i < bound.size() &&
            i < higher.size()) {
          Tolerance t;
          t.bound = bound[i];
          t.higher_is_better = higher[i] != 0;
          const bool within = excess(value[i], t) <= 0;
          if (within != (v == Verdict::kPass)) {
            c.add(m, "row " + std::to_string(i) + ": verdict '" + name(v) + "' but its value " +
                         std::to_string(value[i]) + " is " + (within ? "within" : "beyond") + " its bound " +
                         (t.higher_is_better ? ">= " : "<= ") + std::to_string(bound[i]));
          }
        }
        if (!checked && v != Verdict::kMeasured) {
          c.add(m, "row " + std::to_string(i) + ": an unchecked row (no origin) has verdict '" + name(v) +
                       "', expected measured");
        }
        failing += v == Verdict::kFail;
      }
      // Evidence behind a pass: at least one checked metric row (a comparison whose rows were
      // emptied proves nothing; docs/errors.md "Classes").
      if (verdict && *verdict == Verdict::kPass && checked_rows == 0) {
        c.add(g, "verdict 'pass' but no checked metric row backs it (" + std::to_string(rows->size()) +
                     " rows, none with a bound): a pass needs evidence");
      }
      if (verdict && failing > 0 && *verdict != Verdict::kFail && *verdict != Verdict::kError) {
        c.add(g, "verdict '" + std::string(name(*verdict)) + "' but " + std::to_string(failing) +
                     " of its metric rows fail (expected fail)");
      }
    });
  }
  if (verdict && *verdict == Verdict::kPass && has_divergence) c.add(g, "verdict 'pass' but it has a first_divergence");
  // Optional: a file written before the table existed has none (no speculative rounds).
  const std::string acc = g + "/acceptance";
  if (c.r().kind(acc) != Kind::kMissing && c.columns(acc, layout::acceptance_columns())) {
    c.guarded(acc, [&] {
      const std::vector<std::string> side = c.r().read_strings(acc + "/side");
      const std::vector<int64_t> realised = c.r().read_ints(acc + "/realised"),
                                 index = c.r().read_ints(acc + "/draft_index");
      for (size_t i = 0; i < side.size(); ++i) {
        const std::string row = "row " + std::to_string(i) + ": ";
        if (side[i] != "a" && side[i] != "b") c.add(acc + "/side", row + "'" + side[i] + "' is not \"a\" or \"b\"");
        if (realised[i] < -1 || realised[i] > 1) {
          c.add(acc + "/realised", row + std::to_string(realised[i]) + " is not -1, 0 or 1");
        }
        if (index[i] < -1) c.add(acc + "/draft_index", row + std::to_string(index[i]) + " is below -1");
      }
    });
  }
  const std::string tg = g + "/tensors";
  if (c.group(tg)) {
    for (const std::string& k : c.r().children(tg)) {
      const std::string t = tg + "/" + k;
      if (!c.group(t)) continue;
      c.attr(t, "step", 'i');
      c.attr(t, "layer", 'i');
      for (const char* a : layout::tensor_string_attrs()) c.attr(t, a, 's');
      if (!c.dataset(t + "/values")) continue;
      c.guarded(t, [&] {
        const std::string dtype = c.r().attr_string(t, "logical_dtype");
        const std::vector<int64_t> shape = c.r().attr_ints(t, "shape");
        int64_t n = 1;
        for (int64_t d : shape) {
          if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) {
            c.add(t, "shape attribute has a negative or overflowing dimension " + std::to_string(d));
            n = -1;
            break;
          }
          n *= d;
        }
        if (n < 0) return;
        const H5Reader::DatasetInfo info = c.r().dataset_info(t + "/values");
        int64_t stored = 1;
        for (int64_t d : info.dims) stored *= d;
        if (stored != n) c.add(t + "/values", std::to_string(stored) + " values, its shape attribute " + std::to_string(n));
        const std::map<std::string, std::pair<Type, int>> want = {{"bf16", {Type::kUInt, 16}},
                                                                  {"fp32", {Type::kFloat, 32}},
                                                                  {"int32", {Type::kInt, 32}},
                                                                  {"int64", {Type::kInt, 64}},
                                                                  {"uint8", {Type::kUInt, 8}}};
        const auto it = want.find(dtype);
        if (it == want.end()) {
          c.add(t, "logical_dtype '" + dtype + "' is not bf16, fp32, int32, int64 or uint8");
        } else if (info.type != it->second.first || info.element_bytes * 8 != it->second.second) {
          c.add(t + "/values", "is not stored as the logical dtype " + dtype + " requires (" +
                                   std::to_string(it->second.second) + "-bit, found " +
                                   std::to_string(info.element_bytes * 8) + "-bit)");
        }
      });
    }
  }
  return verdict;
}

void check_scenarios(Checker& c, const std::map<std::pair<std::string, int64_t>, int64_t>& summary,
                     const std::optional<Verdict>& root) {
  if (!c.group(layout::kScenarios)) return;
  std::vector<ScenarioResult> verdicts;  // only .verdict is used
  bool all_known = true;
  std::set<int64_t> indexes;
  std::set<std::pair<std::string, int64_t>> comparisons;
  const std::vector<std::string> names = c.r().children(layout::kScenarios);
  for (const std::string& n : names) {
    const std::string g = layout::scenario_path(n);
    if (!c.group(g)) {
      all_known = false;
      continue;
    }
    if (c.attr(g, "index", 'i')) {
      c.guarded(g, [&] {
        const int64_t i = c.r().attr_int(g, "index");
        if (i < 0 || i >= static_cast<int64_t>(names.size()) || !indexes.insert(i).second) {
          c.add(g, "attribute 'index' " + std::to_string(i) + " is out of range or repeated");
        }
      });
    }
    for (const char* a : layout::scenario_string_attrs()) {
      if (std::string(a) != "verdict") c.attr(g, a, 's');
    }
    c.attr(g, "seed", 'u');
    const std::optional<Verdict> verdict = c.verdict_attr(g);
    if (const auto k = c.strings(g + "/scenario_json"); k && *k != 1) c.add(g + "/scenario_json", "should hold 1 string");
    c.columns(g + "/steps", layout::steps_columns());
    const std::string cg = g + "/comparisons";
    std::optional<Verdict> worst;
    bool comparisons_known = true;
    if (c.group(cg)) {
      const std::vector<std::string> items = c.r().children(cg);
      std::set<std::string> expected;
      for (size_t i = 0; i < items.size(); ++i) expected.insert(layout::index_name(i));
      for (const std::string& item : items) {
        if (!expected.count(item)) c.add(cg, "member '" + item + "' is not numbered 00, 01, ... in run order");
      }
      for (const std::string& item : items) {
        const bool numeric = !item.empty() && item.size() < 10 &&
                             std::all_of(item.begin(), item.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        const int64_t idx = numeric ? std::stoll(item) : -1;
        comparisons.insert({n, idx});
        const auto s = summary.find({n, idx});
        const std::optional<Verdict> v = check_comparison(c, cg + "/" + item, s == summary.end() ? 0 : s->second);
        if (!v) {
          comparisons_known = false;
        } else {
          worst = worst ? worse(*worst, *v) : *v;
        }
      }
    } else {
      comparisons_known = false;
    }
    if (verdict && *verdict == Verdict::kError) {
      if (const auto e = c.string_attr(g, "error"); e && e->empty()) c.add(g, "verdict 'error' but attribute 'error' is empty");
    } else if (verdict && comparisons_known) {
      const Verdict expected = worst.value_or(Verdict::kInconclusive);
      if (*verdict != expected) {
        c.add(g, "verdict '" + std::string(name(*verdict)) + "' but the worst of its comparisons is '" + name(expected) +
                     "'");
      }
    }
    if (verdict) {
      ScenarioResult s;
      s.verdict = *verdict;
      verdicts.push_back(s);
    } else {
      all_known = false;
    }
  }
  for (const auto& [key, n] : summary) {
    if (!comparisons.count(key)) {
      c.add(layout::kSummary, "rows for scenario '" + key.first + "' comparison " + std::to_string(key.second) +
                                  ", which the file does not have");
    }
  }
  if (root && all_known && *root != roll_up(verdicts)) {
    c.add("/", "verdict '" + std::string(name(*root)) + "' but the roll-up of the scenarios is '" +
                   name(roll_up(verdicts)) + "'");
  }
}

}  // namespace

std::vector<std::string> check_report_schema(const std::string& path) {
  const H5Reader r(path);  // throws when the file is not readable HDF5
  Checker c(r);
  const std::optional<std::string> schema = c.string_attr("/", "schema");
  if (!schema) return c.problems;
  if (*schema != layout::kSchema) {
    c.add("/", "attribute 'schema' is '" + *schema + "', not '" + layout::kSchema + "': not a dsv41 divergence report");
    return c.problems;
  }
  if (!c.attr("/", "schema_version", 'i')) return c.problems;
  const int64_t version = r.attr_int("/", "schema_version");
  if (version != layout::kSchemaVersion) {
    c.add("/", "schema_version " + std::to_string(version) + " is not supported (this check knows version " +
                   std::to_string(layout::kSchemaVersion) + ")");
    return c.problems;
  }
  const std::optional<Verdict> root = c.verdict_attr("/");
  if (c.attr("/", "exit_code", 'i') && root) {
    const int64_t code = r.attr_int("/", "exit_code");
    if (code != exit_code(*root)) {
      c.add("/", "exit_code " + std::to_string(code) + " does not match verdict '" + name(*root) + "' (expected " +
                     std::to_string(exit_code(*root)) + ")");
    }
  }
  check_meta(c);
  check_items(c);
  check_replay_tables(c);
  const auto summary = check_summary(c);
  check_scenarios(c, summary, root);
  return c.problems;
}

}  // namespace dsv41::reports
