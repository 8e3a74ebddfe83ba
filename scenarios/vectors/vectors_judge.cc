// scenarios/vectors/vectors_judge.cc
//
// `dsv41 conform --vectors DIR --port-out PORT_DIR` (scenarios/vectors/vectors.h, docs/conform.md): each
// case's expected outputs against the port's, nothing recomputed. One ScenarioResult per case
// (kind "vectors"), one comparison "expected" vs "port" whose rows are, per output out.<name>:
//   F32   out.<name>:bit_equal_frac (bound 1 when the tolerance is 0), :max_abs (bound = the
//         tolerance when it is > 0, else recorded), :nonfinite_mismatch (bound 0)
//   I32   index_topk: out.topk:rows_equal_frac, rows compared AS SETS (the tie rule, lower position
//         wins, makes the set unique; the order inside a row is not judged); other ops:
//         :equal_frac, element by element (expert order, index rows)
//   I64   :equal_frac;  U8 (masks, cache bytes): :bytes_equal_frac
// A case the port wrote no file for, or an output it left out, is "not covered" (inconclusive).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "scenarios/judge/judge.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/vectors/vectors.h"
#include "scenarios/vectors/vectors_internal.h"

namespace dsv41::scenarios::vectors {

namespace fs = std::filesystem;
namespace st = reference::checkpoint::safetensors;
using json = nlohmann::json;
using reports::MetricRow;
using reports::Tolerance;
using reports::Verdict;
using vectors_detail::get_f32;
using vectors_detail::get_i32;
using vectors_detail::get_i64;

namespace {

Tolerance bound(double b, bool higher_is_better, const std::string& origin) {
  Tolerance t;
  t.bound = b;
  t.higher_is_better = higher_is_better;
  t.origin = origin.rfind("measured", 0) == 0 ? "measured" : "stated";
  t.note = origin;
  return t;
}

std::string meta(const st::SafetensorsFile& f, const std::string& key) {
  const auto it = f.metadata().find(key);
  DSV41_CHECK(it != f.metadata().end(), f.path(), ": __metadata__ has no '", key, "'");
  return it->second;
}

std::string coord(const std::vector<int64_t>& c) {
  std::string s = "[";
  for (size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + std::to_string(c[i]);
  return s + "]";
}

// The rows of one output; `detail` receives where it first differs.
std::vector<MetricRow> compare_output(const std::string& op, const std::string& key, const st::SafetensorsFile& exp,
                                      const st::SafetensorsFile& port, double tol, const std::string& origin,
                                      std::string* detail) {
  std::vector<MetricRow> rows;
  const auto add = [&](const std::string& metric, double value, std::optional<Tolerance> t) {
    MetricRow r;
    r.component = op;
    r.metric = key + ":" + metric;
    r.value = value;
    r.tolerance = std::move(t);
    judge::judge_row(r);
    rows.push_back(r);
  };
  const st::Entry& a = exp.get(key);
  const st::Entry& b = port.get(key);
  DSV41_CHECK(b.dtype == a.dtype && b.shape == a.shape, port.path(), ": tensor '", key, "' is ",
              reference::dtype_name(b.dtype), " ", reference::shape_string(b.shape), ", the case expects ",
              reference::dtype_name(a.dtype), " ", reference::shape_string(a.shape));
  const std::string what = op + " " + key;
  std::ostringstream d;
  d.precision(9);
  try {
    if (a.dtype == reference::DType::kF32) {
      const judge::TensorMetrics m = judge::compare_tensors(get_f32(exp, key), get_f32(port, key), judge::ValueType::kFp32, what);
      add("bit_equal_frac", m.bit_equal_frac, tol == 0 ? std::optional<Tolerance>(bound(1, true, origin)) : std::nullopt);
      add("max_abs", m.max_abs, tol > 0 ? std::optional<Tolerance>(bound(tol, false, origin)) : std::nullopt);
      add("nonfinite_mismatch", static_cast<double>(m.nan_mismatch + m.inf_mismatch), bound(0, false, origin));
      add("max_ulp", m.max_ulp, std::nullopt);
      if (m.first_mismatch >= 0) {
        d << "first mismatch at " << coord(m.first_mismatch_coord) << ": expected " << m.a_at_first << ", port "
          << m.b_at_first << " (" << (m.count - m.bit_equal) << " of " << m.count << " differ, max |d| " << m.max_abs
          << ")";
      }
    } else if (a.dtype == reference::DType::kI32 && op == "index_topk") {
      const judge::IndexMetrics m = judge::compare_index_sets(get_i32(exp, key), get_i32(port, key), nullptr, 0.0, what);
      add("rows_equal_frac", m.rows ? static_cast<double>(m.rows_equal) / static_cast<double>(m.rows) : 1.0,
          bound(1, true, origin));
      if (m.first_row_differs >= 0) {
        d << "row " << m.first_row_differs << " differs as a set (Jaccard "
          << m.per_row[static_cast<size_t>(m.first_row_differs)].jaccard << "; tie rule: lower position wins)";
      }
    } else {
      const auto ints = [&](const st::SafetensorsFile& f) {
        if (a.dtype == reference::DType::kI64) return get_i64(f, key);
        if (a.dtype == reference::DType::kI32) {
          const reference::Tensor<int32_t> t = get_i32(f, key);
          return std::vector<int64_t>(t.data().begin(), t.data().end());
        }
        const reference::Tensor<uint8_t> t = vectors_detail::get_u8(f, key);
        return std::vector<int64_t>(t.data().begin(), t.data().end());
      };
      const std::vector<int64_t> x = ints(exp), y = ints(port);
      const judge::IntMetrics m = judge::compare_ints(x, y, what);
      const double frac = m.count ? static_cast<double>(m.equal) / static_cast<double>(m.count) : 1.0;
      add(a.dtype == reference::DType::kU8 ? "bytes_equal_frac" : "equal_frac", frac, bound(1, true, origin));
      if (m.first_mismatch >= 0) {
        d << "first mismatch at flat index " << m.first_mismatch << ": expected " << x[static_cast<size_t>(m.first_mismatch)]
          << ", port " << y[static_cast<size_t>(m.first_mismatch)] << " (" << (m.count - m.equal) << " of " << m.count
          << " differ)";
      }
    }
  } catch (const Error& e) {  // e.g. a repeated index in a port's row: wrong, not unreadable
    add("comparable", 0.0, bound(1, true, origin));
    d << "not comparable: " << e.what();
  }
  *detail = d.str();
  return rows;
}

reports::ScenarioResult judge_case(const VectorSet& set, const VectorSetEntry& c, const std::string& port_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  const st::SafetensorsFile exp = st::SafetensorsFile::read((fs::path(set.dir) / c.file).string());
  DSV41_CHECK(meta(exp, "op") == c.op && meta(exp, "case") == c.name, exp.path(), ": __metadata__ op/case '",
              meta(exp, "op"), "' / '", meta(exp, "case"), "' disagree with ", kVectorsManifest, " ('", c.op, "' / '",
              c.name, "')");
  const std::string origin = meta(exp, "tolerance_origin");
  const double tol = std::stod(meta(exp, "tolerance"));
  reports::ScenarioResult s;
  s.name = c.name;
  s.kind = kVectorsMode;
  s.description = meta(exp, "description");
  s.source = exp.path();
  s.seed = std::stoull(meta(exp, "seed"));
  json sj = {{"op", c.op}, {"size", c.size}, {"adversarial", meta(exp, "adversarial")}, {"tolerance", tol},
             {"tolerance_origin", origin}};
  for (const auto& [k, v] : exp.metadata()) {
    if (k.rfind("param.", 0) == 0) sj["params"][k.substr(6)] = v;
  }
  s.scenario_json = sj.dump();
  s.steps.push_back({0, 0, "vectors", 0, 0, {}});
  reports::Comparison cmp;
  cmp.side_a = "expected";
  cmp.side_b = "port";
  cmp.mode = kVectorsMode;
  cmp.expectation = tol == 0 ? "bitexact" : "tolerance";
  cmp.expectation_origin = origin;
  const fs::path port_path = fs::path(port_dir) / c.file;
  bool missing = false;
  if (!fs::exists(port_path)) {
    cmp.notes.push_back("not covered: the port wrote no " + port_path.string());
    missing = true;
  } else {
    const st::SafetensorsFile port = st::SafetensorsFile::read(port_path.string());
    for (const std::string& key : port.names()) {
      DSV41_CHECK(key.rfind("out.", 0) != 0 || exp.contains(key), port.path(), ": tensor '", key,
                  "' is not an output of case ", c.name);
    }
    for (const std::string& key : exp.names()) {
      if (key.rfind("out.", 0) != 0) continue;
      if (!port.contains(key)) {
        cmp.notes.push_back("not covered: " + port.path() + " has no '" + key + "'");
        missing = true;
        continue;
      }
      std::string detail;
      std::vector<MetricRow> rows = compare_output(c.op, key, exp, port, tol, origin, &detail);
      ++cmp.items_compared;
      for (MetricRow& r : rows) {
        if (r.verdict == Verdict::kFail && !cmp.first_divergence) {
          reports::Divergence dv = judge::divergence_at(r);
          dv.tolerance = *r.tolerance;
          dv.detail = detail;
          dv.rerun = "dsv41 conform --vectors " + set.dir + " --port-out " + port_dir + " --only " + c.op;
          cmp.first_divergence = dv;
        }
        if (r.verdict == Verdict::kFail) cmp.notes.push_back("FAIL " + c.name + " " + r.metric + ": " + detail);
        cmp.rows.push_back(std::move(r));
      }
    }
  }
  cmp.steps_compared = 1;
  const bool failed = std::any_of(cmp.rows.begin(), cmp.rows.end(), [](const MetricRow& r) { return r.verdict == Verdict::kFail; });
  cmp.verdict = failed ? Verdict::kFail : missing || cmp.items_compared == 0 ? Verdict::kInconclusive : Verdict::kPass;
  cmp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.verdict = cmp.verdict;
  s.comparisons.push_back(std::move(cmp));
  return s;
}

}  // namespace

namespace {
constexpr const char* kNotRequired = " (not required: --require names other ops)";
}  // namespace

bool skipped_case(const reports::Comparison& c) {
  return c.verdict == Verdict::kMeasured && std::any_of(c.notes.begin(), c.notes.end(), [](const std::string& n) {
           return n.size() > std::strlen(kNotRequired) && n.compare(n.size() - std::strlen(kNotRequired), std::string::npos, kNotRequired) == 0;
         });
}

std::vector<reports::JunitSuite> vectors_junit_suites(const reports::RunReport& r) {
  reports::JunitSuite suite;
  suite.name = "dsv41.vectors";
  suite.properties = {{"verdict", reports::name(r.verdict)}, {"vectors", r.meta.weights}};
  for (const reports::ScenarioResult& s : r.scenarios) {
    const reports::Comparison& c = s.comparisons.front();
    reports::JunitCase k{"dsv41.vectors", s.name, reports::JunitCase::Kind::kPass, "", "", c.seconds};
    std::string notes;
    for (const std::string& n : c.notes) notes += (notes.empty() ? "" : "\n") + n;
    if (skipped_case(c)) {
      k.kind = reports::JunitCase::Kind::kSkipped;
      k.message = c.notes.front();
    } else if (c.verdict == Verdict::kFail) {
      k.kind = reports::JunitCase::Kind::kFail;
      k.message = c.first_divergence ? c.first_divergence->metric + " = " + std::to_string(c.first_divergence->value) + ": " +
                                           c.first_divergence->detail
                                     : "fail";
      k.body = notes + (c.first_divergence ? "\nrerun: " + c.first_divergence->rerun : "");
    } else if (c.verdict == Verdict::kInconclusive) {
      k.kind = reports::JunitCase::Kind::kInconclusive;
      k.message = notes.empty() ? "inconclusive: evidence missing" : notes;
    } else if (c.verdict == Verdict::kError) {
      k.kind = reports::JunitCase::Kind::kError;
      k.message = notes.empty() ? "error" : notes;
    }
    suite.cases.push_back(std::move(k));
  }
  return {suite};
}

reports::RunReport conform_vectors(const std::string& vectors_dir, const std::string& port_dir, const std::string& only,
                                   const std::vector<std::string>& require) {
  const VectorSet set = read_vector_set(vectors_dir);
  DSV41_CHECK(fs::is_directory(port_dir), "--port-out '", port_dir, "' is not a directory");
  for (const std::string& op : require) {
    DSV41_CHECK(std::any_of(set.cases.begin(), set.cases.end(), [&](const VectorSetEntry& c) { return c.op == op; }),
                "--require: no case of op '", op, "' in ", vectors_dir, " (", kVectorsManifest, ")");
  }
  reports::RunReport r;
  r.meta.config_name = vectors_dir + "/" + kVectorsManifest;
  r.meta.weights = "vectors:" + vectors_dir;
  r.meta.seeds["vectors"] = set.seed;
  r.meta.sides = {"expected", "port"};
  for (const VectorSetEntry& c : set.cases) {
    if (!only.empty() && c.op != only) continue;
    r.scenarios.push_back(judge_case(set, c, port_dir));
    reports::ScenarioResult& s = r.scenarios.back();
    const bool required = require.empty() || std::find(require.begin(), require.end(), c.op) != require.end();
    if (!required && s.verdict == Verdict::kInconclusive && s.comparisons.front().rows.empty()) {
      reports::Comparison& cmp = s.comparisons.front();  // not covered, and the port does not claim the op
      for (std::string& n : cmp.notes) n += kNotRequired;
      cmp.verdict = s.verdict = Verdict::kMeasured;
    }
  }
  DSV41_CHECK(!r.scenarios.empty() || only.empty(), "--only '", only, "': no case of that op in ", vectors_dir);
  r.verdict = reports::roll_up(r.scenarios);
  return r;
}

}  // namespace dsv41::scenarios::vectors
