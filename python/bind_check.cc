// python/bind_check.cc
//
// dsv41.check(component, inputs, outputs, params, config, tolerances) (docs/python.md, "check"):
// judges a port's outputs of ONE component in memory. The reference recomputes the component
// from the port's own inputs (the teacher-forced principle of `dsv41 conform`) and each output is
// compared with the metrics, bounds and tie rules of `dsv41 conform` (docs/conform.md):
//
//   floats      bit-exact by default (bit_equal_frac = 1, origin stated); NaN/Inf masks always
//               exact (nonfinite_mismatch = 0); measured beside: max_ulp, max_abs, nmse,
//               calc_diff, cosine, allclose (atol/rtol of the tolerances)
//   top-k       rows AS SETS (the tie rule, lower position wins, makes the set unique):
//               rows_equal_frac = 1; tie_equivalent against the reference's scores says whether
//               every difference lies inside the tie band (another tie rule), jaccard_min, recall_min
//   experts     rows as sets (rows_equal_frac); other int outputs element by element (equal_frac)
//   candidates  masks per row (rows_equal_frac), block_recall_min, token_recall_min
//   bytes       bytes_equal_frac
// Tolerances: the conform file's format ({key: {metric: bound, "origin": ..., "note": ...}}),
// key = "<component>.<output>", "<output>", "<component>" or "*" (the first that exists); a key
// named replaces the bit-exact rows of that output with its own bounds (the always-exact rows stay).
//
// Components: every op of the conformance vectors (scenarios/vectors/vectors_port.cc: index_scores,
// index_topk, candidate_blocks, compress, sparse_attn, ...), and "indexer" (index_scores ->
// candidate_blocks (with topk_blocks, block_size) or a given mask -> index_topk; outputs
// index_scores (masked), candidates, topk: the hook names), "compressor" (= compress),
// "attention" (= sparse_attn).
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "python/bindings.h"
#include "python/op_inputs.h"
#include "reference/seam/ops.h"
#include "reports/report.h"
#include "scenarios/conform/conform.h"
#include "scenarios/judge/judge.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/vectors/vectors.h"

namespace dsv41::python {

namespace {

namespace st = reference::checkpoint::safetensors;
using json = nlohmann::json;
using reference::Tensor;
using reports::Tolerance;
using Bounds = std::map<std::string, Tolerance>;

// ---- tolerances ----

// The tolerance format and the bit-exact claim's bounds are conform's own
// (scenarios/conform/conform.h): keys here are check's names ("op.output", "output", "op", "*").
std::map<std::string, Bounds> parse_tolerances(const std::string& text) {
  if (text.empty()) return {};
  return scenarios::conform::parse_conform_tolerances(text, "tolerances", [](const std::string&, const std::string&) {});
}

// conform's bound (bit-exact claim); "comparable" (the outputs could be compared at all) is
// exact like conform's structure rows.
std::optional<Tolerance> bound_of(const Bounds* f, const std::string& metric) {
  if (metric == "comparable") return scenarios::conform::bit_exact_bound(nullptr, "bit_equal_frac");
  return scenarios::conform::bit_exact_bound(f, metric);
}

// ---- the reference's outputs ----

struct RefOutputs {
  std::map<std::string, st::Entry> out;  // by output name (no "out.")
  std::vector<std::string> order;
  Tensor<float> scores;                  // the scores a top-k was chosen from (tie analysis), if any
  bool has_scores = false;
};

void add(RefOutputs& r, st::Entry e) {
  std::string name = e.name.rfind("out.", 0) == 0 ? e.name.substr(4) : e.name;
  e.name = name;
  r.order.push_back(name);
  r.out[name] = std::move(e);
}

st::Entry f32_entry(const std::string& name, const Tensor<float>& t) {
  st::Entry e{name, reference::DType::kF32, t.shape(), std::vector<uint8_t>(t.data().size() * 4)};
  if (!e.bytes.empty()) std::memcpy(e.bytes.data(), t.data().data(), e.bytes.size());
  return e;
}
template <typename T>
st::Entry int_entry(const std::string& name, reference::DType d, const Tensor<T>& t) {
  st::Entry e{name, d, t.shape(), std::vector<uint8_t>(t.data().size() * sizeof(T))};
  if (!e.bytes.empty()) std::memcpy(e.bytes.data(), t.data().data(), e.bytes.size());
  return e;
}
Tensor<float> entry_f32(const st::Entry& e) {
  std::vector<float> v(static_cast<size_t>(e.numel()));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return Tensor<float>(e.shape, std::move(v), e.name);
}
template <typename T>
Tensor<T> entry_int(const st::Entry& e) {
  std::vector<T> v(static_cast<size_t>(e.numel()));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return Tensor<T>(e.shape, std::move(v), e.name);
}

std::string param(const py::dict& p, const char* k) {
  DSV41_CHECK(p.contains(k), "indexer: parameter '", k, "' is missing");
  return py::str(p[k]).cast<std::string>();
}
// An int parameter, range-checked before narrowing (python/bindings.h int_param).
template <typename T = int>
T param_int(const py::dict& p, const char* k) {
  DSV41_CHECK(p.contains(k), "indexer: parameter '", k, "' is missing");
  return int_param<T>(p[k], k);
}
py::handle input(const py::dict& in, const char* k) {
  DSV41_CHECK(in.contains(k), "indexer: input '", k, "' is missing");
  return in[k];
}

// index_scores -> candidate_blocks or a given mask -> index_topk, as the model's index layers run them.
RefOutputs run_indexer(const py::dict& in, const py::dict& p) {
  const reference::seam::Ops& ops = reference::seam::reference_ops();
  const Tensor<float> q = to_f32(input(in, "q"), "q"), w = to_f32(input(in, "weights"), "weights");
  const Tensor<uint8_t> keys = to_int<uint8_t>(input(in, "keys"), "keys");
  const Tensor<int64_t> reach = to_int<int64_t>(input(in, "reach"), "reach");
  reference::CacheRows rows;
  rows.format = formats::cache_format_from_name(param(p, "keys_format"));
  rows.dim = param_int(p, "keys_dim");
  rows.count = p.contains("keys_count") ? param_int<int64_t>(p, "keys_count") : (keys.rank() == 2 ? keys.dim(0) : 0);
  DSV41_CHECK(keys.rank() == 2 && keys.dim(1) == formats::entry_bytes(rows.format, static_cast<int>(rows.dim)) &&
                  keys.dim(0) >= rows.count,
              "indexer: keys ", reference::shape_string(keys.shape()), " are not [>= ", rows.count, ", ",
              formats::entry_bytes(rows.format, static_cast<int>(rows.dim)), "] entries of ", param(p, "keys_format"));
  rows.bytes = &keys;
  RefOutputs r;
  Tensor<float> scores = ops.index_scores(q, rows, w, reach.data());
  if (p.contains("topk_blocks") || p.contains("block_size")) {
    const Tensor<uint8_t> mask = ops.candidate_blocks(scores, reach.data(), param_int(p, "topk_blocks"),
                                                      param_int(p, "block_size"));
    add(r, int_entry("candidates", reference::DType::kU8, mask));
  } else if (in.contains("mask")) {
    ops.mask_scores(scores, to_int<uint8_t>(in["mask"], "mask"));
  }
  const Tensor<int32_t> topk = ops.index_topk(scores, reach.data(), param_int(p, "k"));
  r.scores = scores;
  r.has_scores = true;
  RefOutputs ordered;
  add(ordered, f32_entry("index_scores", scores));
  for (const std::string& n : r.order) add(ordered, r.out.at(n));
  add(ordered, int_entry("topk", reference::DType::kI32, topk));
  ordered.scores = std::move(r.scores);
  ordered.has_scores = true;
  return ordered;
}

// ---- judging one output ----

struct Judged {
  std::vector<reports::MetricRow> rows;
  std::string detail;  // where it first differs
};

std::string coord(const std::vector<int64_t>& c) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < c.size(); ++i) s << (i ? ", " : "") << c[i];
  return s.str() + "]";
}

std::vector<int64_t> unflatten(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return c;
}

bool all_bf16(const Tensor<float>& t) {
  return std::all_of(t.data().begin(), t.data().end(), [](float v) { return (f32_bits(v) & 0xFFFFu) == 0; });
}

std::string set_string(const int32_t* row, int64_t k) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < k; ++i) {
    if (row[i] >= 0) v.push_back(row[i]);
  }
  std::sort(v.begin(), v.end());
  std::ostringstream s;
  s << "{";
  for (size_t i = 0; i < v.size() && i < 12; ++i) s << (i ? ", " : "") << v[i];
  if (v.size() > 12) s << ", ... (" << v.size() << ")";
  return s.str() + "}";
}

Judged judge(const std::string& component, const std::string& name, const st::Entry& ref, const py::handle& port_h,
             const RefOutputs& r, const Bounds* bounds, int block_size) {
  Judged j;
  const auto row = [&](const std::string& metric, double value) {
    reports::MetricRow m;
    m.component = component;
    m.metric = name + ":" + metric;
    m.value = value;
    m.tolerance = bound_of(bounds, metric);
    scenarios::judge::judge_row(m);
    j.rows.push_back(m);
  };
  const std::string what = component + " " + name;
  std::ostringstream d;
  d.precision(9);
  try {
    if (ref.dtype == reference::DType::kF32) {
      const Tensor<float> a = entry_f32(ref);
      const Tensor<float> b = to_f32(port_h, name);
      DSV41_CHECK(a.shape() == b.shape(), "output '", name, "': the port's shape ", reference::shape_string(b.shape()),
                  ", the reference's ", reference::shape_string(a.shape()));
      const scenarios::judge::ValueType type = all_bf16(a) && all_bf16(b) ? scenarios::judge::ValueType::kBf16 : scenarios::judge::ValueType::kFp32;
      const scenarios::judge::TensorMetrics m = scenarios::judge::compare_tensors(a, b, type, what);
      const double atol = bounds && bounds->count("atol") ? bounds->at("atol").bound : 0.0;
      const double rtol = bounds && bounds->count("rtol") ? bounds->at("rtol").bound : 0.0;
      const scenarios::judge::PortMetrics p = scenarios::judge::port_metrics(a.data(), b.data(), atol, rtol, what);
      row("bit_equal_frac", m.bit_equal_frac);
      row("nonfinite_mismatch", static_cast<double>(m.nan_mismatch + m.inf_mismatch));
      row("max_ulp", m.max_ulp);
      row("max_abs", m.max_abs);
      row("nmse", m.nmse);
      row("calc_diff", p.calc_diff);
      row("cosine", p.cosine);
      row("allclose", p.allclose ? 1.0 : 0.0);
      if (m.first_mismatch >= 0) {
        d << "first mismatch at " << coord(m.first_mismatch_coord) << ": ref=" << m.a_at_first << " port=" << m.b_at_first
          << "; " << (m.count - m.bit_equal) << " of " << m.count << " differ, max ulp " << m.max_ulp << " ("
          << scenarios::judge::name(type) << "), max |d| " << m.max_abs << ", NMSE " << m.nmse << ", calc_diff " << p.calc_diff;
      }
      if (m.nan_mismatch + m.inf_mismatch > 0) d << "; " << m.nan_mismatch << " NaN / " << m.inf_mismatch << " Inf masks differ";
    } else if (ref.dtype == reference::DType::kI32 && (name == "topk" || name == "experts")) {
      const Tensor<int32_t> a = entry_int<int32_t>(ref);
      const Tensor<int32_t> b = to_int<int32_t>(py::array(as_array(port_h).attr("astype")("int32")), name);
      DSV41_CHECK(a.rank() == 2 && b.rank() == 2 && a.dim(0) == b.dim(0), "output '", name, "': the port's shape ",
                  reference::shape_string(b.shape()), ", the reference's ", reference::shape_string(a.shape()));
      const bool tie = name == "topk" && r.has_scores;
      const scenarios::judge::IndexMetrics m = scenarios::judge::compare_index_sets(a, b, tie ? &r.scores : nullptr, 0.0, what);
      row("rows_equal_frac", m.rows ? static_cast<double>(m.rows_equal) / static_cast<double>(m.rows) : 1.0);
      row("jaccard_min", m.min_jaccard);
      row("recall_min", m.min_recall);
      if (tie) row("tie_equivalent", m.tie_equivalent ? 1.0 : 0.0);
      if (m.first_row_differs >= 0) {
        const int64_t t = m.first_row_differs;
        std::set<int32_t> sa, sb;
        for (int64_t i = 0; i < a.dim(1); ++i) if (a.at(t, i) >= 0) sa.insert(a.at(t, i));
        for (int64_t i = 0; i < b.dim(1); ++i) if (b.at(t, i) >= 0) sb.insert(b.at(t, i));
        std::vector<int32_t> only_a, only_b;
        std::set_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(only_a));
        std::set_difference(sb.begin(), sb.end(), sa.begin(), sa.end(), std::back_inserter(only_b));
        d << "first differing row " << t << " (as sets): ref " << set_string(a.row(t), a.dim(1)) << " port "
          << set_string(b.row(t), b.dim(1));
        if (!only_a.empty()) d << "; position " << only_a.front() << " [" << t << ", " << only_a.front() << "] only in ref";
        if (!only_b.empty()) d << "; position " << only_b.front() << " [" << t << ", " << only_b.front() << "] only in port";
        if (tie) {
          d << (m.tie_equivalent ? "; every difference inside the tie band (another tie rule: dsv41's lower position wins)"
                                 : "; differences outside the tie band");
        }
        d << "; " << (m.rows - m.rows_equal) << " of " << m.rows << " rows differ";
      }
    } else if (ref.dtype == reference::DType::kU8 && (name == "candidates" || name == "mask")) {
      const Tensor<uint8_t> a = entry_int<uint8_t>(ref);
      const Tensor<uint8_t> b = to_int<uint8_t>(py::array(as_array(port_h).attr("astype")("uint8")), name);
      DSV41_CHECK(a.shape() == b.shape(), "output '", name, "': the port's shape ", reference::shape_string(b.shape()),
                  ", the reference's ", reference::shape_string(a.shape()));
      const scenarios::judge::CandidateMetrics m = scenarios::judge::compare_candidates(a, b, std::max(1, block_size), what);
      row("rows_equal_frac", m.rows ? static_cast<double>(m.rows_equal) / static_cast<double>(m.rows) : 1.0);
      row("block_recall_min", m.min_block_recall);
      row("token_recall_min", m.min_token_recall);
      if (m.first_row_differs >= 0) {
        const int64_t t = m.first_row_differs;
        int64_t n = 0;
        while (n < a.dim(1) && a.at(t, n) == b.at(t, n)) ++n;
        d << "first mismatch at [" << t << ", " << n << "]: ref=" << int{a.at(t, n)} << " port=" << int{b.at(t, n)}
          << " (block " << n / std::max(1, block_size) << "); block recall min " << m.min_block_recall << "; "
          << (m.rows - m.rows_equal) << " of " << m.rows << " rows differ";
      }
    } else {
      std::vector<int64_t> x;
      if (ref.dtype == reference::DType::kI64) x = entry_int<int64_t>(ref).data();
      else if (ref.dtype == reference::DType::kI32) { const auto t = entry_int<int32_t>(ref); x.assign(t.data().begin(), t.data().end()); }
      else { const auto t = entry_int<uint8_t>(ref); x.assign(t.data().begin(), t.data().end()); }
      const Tensor<int64_t> b = to_int<int64_t>(py::array(as_array(port_h).attr("astype")("int64")), name);
      DSV41_CHECK(b.shape() == ref.shape, "output '", name, "': the port's shape ", reference::shape_string(b.shape()),
                  ", the reference's ", reference::shape_string(ref.shape));
      const scenarios::judge::IntMetrics m = scenarios::judge::compare_ints(x, b.data(), what);
      const double frac = m.count ? static_cast<double>(m.equal) / static_cast<double>(m.count) : 1.0;
      row(ref.dtype == reference::DType::kU8 ? "bytes_equal_frac" : "equal_frac", frac);
      if (m.first_mismatch >= 0) {
        d << "first mismatch at " << coord(unflatten(m.first_mismatch, ref.shape)) << ": ref="
          << x[static_cast<size_t>(m.first_mismatch)] << " port=" << b.data()[static_cast<size_t>(m.first_mismatch)] << "; "
          << (m.count - m.equal) << " of " << m.count << " differ";
      }
    }
  } catch (const Error& e) {  // e.g. a repeated index in a port's row: wrong, not unreadable
    row("comparable", 0.0);
    d << "not comparable: " << e.what();
  }
  j.detail = d.str();
  return j;
}

const Bounds* bounds_for(const std::map<std::string, Bounds>& tol, const std::string& component, const std::string& out) {
  for (const std::string& k : {component + "." + out, out, component, std::string("*")}) {
    const auto it = tol.find(k);
    if (it != tol.end()) return &it->second;
  }
  return nullptr;
}

py::dict check(const std::string& component_in, const py::dict& inputs, const py::dict& outputs, const py::dict& params,
               const reference::ModelConfig* config, const std::string& tolerances) {
  const std::map<std::string, Bounds> tol = parse_tolerances(tolerances);
  const std::string op = component_in == "compressor" ? "compress" : component_in == "attention" ? "sparse_attn" : component_in;
  RefOutputs r;
  if (op == "indexer") {
    r = run_indexer(inputs, params);
  } else {
    const st::SafetensorsFile f = op_case(op, inputs, params, config);
    for (st::Entry& e : scenarios::vectors::run_vector_case(reference::seam::reference_ops(), f)) add(r, std::move(e));
    if (op == "index_topk" && inputs.contains("scores")) {
      r.scores = to_f32(inputs["scores"], "scores");
      r.has_scores = true;
    }
  }
  for (const auto& [k, v] : outputs) {
    const std::string name = py::str(k).cast<std::string>();
    if (!r.out.count(name)) {
      std::string known;
      for (const std::string& n : r.order) known += (known.empty() ? "" : ", ") + n;
      DSV41_FAIL(component_in, ": '", name, "' is not an output of the component (its outputs: ", known, ")");
    }
  }
  const int block_size = params.contains("block_size") ? int_param(params["block_size"], "block_size") : 1;
  py::list rows, failures, not_covered, compared;
  py::dict ref_out;
  for (const std::string& name : r.order) {
    const st::Entry& e = r.out.at(name);
    std::vector<st::Entry> one = {e};
    for (const auto& [k, v] : outputs_dict(std::move(one))) ref_out[k] = v;
    if (!outputs.contains(name.c_str())) {
      not_covered.append(name);
      continue;
    }
    compared.append(name);
    const Judged j = judge(component_in, name, e, outputs[name.c_str()], r, bounds_for(tol, component_in, name), block_size);
    bool reported = false;
    for (const reports::MetricRow& m : j.rows) {
      py::dict d;
      d["output"] = name;
      d["metric"] = m.metric.substr(name.size() + 1);
      d["value"] = m.value;
      d["verdict"] = reports::name(m.verdict);
      d["bound"] = m.tolerance ? py::cast(m.tolerance->bound) : py::none();
      d["origin"] = m.tolerance ? py::cast(m.tolerance->origin) : py::none();
      rows.append(d);
      if (m.verdict == reports::Verdict::kFail && !reported) {
        std::ostringstream line;
        line.precision(9);
        line << component_in << ": output '" << name << "': " << m.metric.substr(name.size() + 1) << " = " << m.value
             << " (bound " << (m.tolerance->higher_is_better ? ">= " : "<= ") << m.tolerance->bound << ", "
             << m.tolerance->origin << "): " << j.detail;
        failures.append(line.str());
        reported = true;
      }
    }
  }
  DSV41_CHECK(py::len(compared) > 0, component_in, ": no output to judge (its outputs: ",
              py::str(py::cast(r.order)).cast<std::string>(), ")");
  py::dict out;
  out["component"] = component_in;
  out["passed"] = py::len(failures) == 0;
  out["verdict"] = py::len(failures) ? "fail" : "pass";
  out["failures"] = failures;
  out["rows"] = rows;
  out["compared"] = compared;
  out["not_covered"] = not_covered;
  out["reference"] = ref_out;
  return out;
}

}  // namespace

void register_check(py::module_& m) {
  m.def("check", &check, py::arg("component"), py::arg("inputs"), py::arg("outputs"), py::arg("params") = py::dict(),
        py::arg("config") = nullptr, py::arg("tolerances") = "",
        "judge a port's outputs of one component in memory (docs/python.md 'check'): -> {component, passed, verdict, "
        "failures [message], rows [{output, metric, value, verdict, bound, origin}], compared, not_covered, reference}");
}

}  // namespace dsv41::python
