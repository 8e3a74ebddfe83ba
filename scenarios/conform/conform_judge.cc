// scenarios/conform/conform_judge.cc
//
// The judging pieces of `dsv41 conform` (scenarios/conform/conform.h): the tolerance file, the cache layout
// diagnosis, a failure's detail (the metrics port engineers use are the judge's: scenarios/judge/judge.h).
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/json_keys.h"
#include "base/json_limits.h"
#include "formats/cache_format.h"
#include "formats/cache_layout.h"
#include "base/error.h"
#include "base/input_file.h"
#include "base/json_context.h"
#include "reference/model/hooks.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/judge/invariants.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/runner/compare.h"

namespace dsv41::scenarios::conform {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// The tolerance file.

namespace {

// The metrics a tolerance file may bound (docs/conform.md), and whether higher is better.
// "max_ulps" is the file's name of the report's "max_ulp"; "atol"/"rtol" bound the allclose row.
const std::map<std::string, bool>& file_metrics() {
  static const std::map<std::string, bool> m = {
      {"nmse", false},          {"max_ulps", false},        {"max_abs", false},       {"calc_diff", false},
      {"cosine", true},         {"kl", false},              {"atol", false},          {"rtol", false},
      {"bit_equal_frac", true}, {"rows_equal_frac", true},  {"jaccard_min", true},    {"recall_min", true},
      {"tie_equivalent", true}, {"block_recall_min", true}, {"token_recall_min", true}, {"top1_agree", true},
      {"equal_frac", true},     {"bytes_equal_frac", true}};
  return m;
}

}  // namespace

std::string conform_detail::read_tolerance_file(const std::string& path) {
  return input::read_text_file(path, "--tolerances file", input::kMaxToleranceBytes);
}

json conform_detail::parse_tolerance_json(const std::string& text, const std::string& where) {
  dsv41::check_json_nesting(text, where);
  try {
    return dsv41::parse_json_without_duplicates(text, where);
  } catch (const json::exception& e) {
    DSV41_FAIL(where, ": not valid JSON: ", e.what());
  }
}

ConformTolerances load_conform_tolerances(const std::string& path) {
  const std::string text = conform_detail::read_tolerance_file(path);
  const std::string where = "--tolerances '" + path + "'";
  // A field of the wrong type names the file (base/json_context.h), not "[json.exception...]".
  return json_context(where, [&] {
    return parse_conform_tolerances(text, where, [](const std::string& key, const std::string& at) {
      if (key != "*" && !reference::model::component_from_name(key)) {
        DSV41_FAIL(at, ": not a component of reference/model/hooks.h (nor \"*\")");
      }
    });
  });
}

ConformTolerances parse_conform_tolerances(
    const std::string& text, const std::string& where_file,
    const std::function<void(const std::string& key, const std::string& at)>& check_key) {
  const json j = conform_detail::parse_tolerance_json(text, where_file);
  if (!j.is_object()) DSV41_FAIL(where_file, ": expected an object {component: {metric: bound}}");
  ConformTolerances out;
  for (const auto& [component, bounds] : j.items()) {
    if (component == "waivers") continue;  // parse_conform_waivers (conform_waivers.cc)
    const std::string where = where_file + ", key '" + component + "'";
    check_key(component, where);
    if (!bounds.is_object()) DSV41_FAIL(where, ": expected an object {metric: bound, \"origin\": ..., \"note\": ...}");
    if (!bounds.contains("origin") || !bounds["origin"].is_string()) {
      DSV41_FAIL(where, ": no \"origin\" (stated, analytic or measured): every bound says where it comes from");
    }
    const std::string origin = bounds["origin"].get<std::string>();
    if (origin != "stated" && origin != "analytic" && origin != "measured") {
      DSV41_FAIL(where, ": origin '", origin, "': expected stated, analytic or measured");
    }
    const std::string note = bounds.value("note", "given in " + where_file);
    std::map<std::string, reports::Tolerance>& m = out[component];
    for (const auto& [metric, value] : bounds.items()) {
      if (metric == "origin" || metric == "note") continue;
      const auto it = file_metrics().find(metric);
      if (it == file_metrics().end()) {
        std::string known;
        for (const auto& [k, hib] : file_metrics()) known += (known.empty() ? "" : ", ") + k;
        DSV41_FAIL(where, ": unknown metric '", metric, "' (known: ", known, ")");
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
        DSV41_FAIL(where, ": metric '", metric, "': the bound must be a finite number >= 0, got ", value.dump());
      }
      reports::Tolerance t;
      t.bound = value.get<double>();
      t.higher_is_better = it->second;
      t.origin = origin;
      t.note = note;
      m[metric == "max_ulps" ? "max_ulp" : metric] = t;
    }
    if (m.count("rtol") && !m.count("atol")) DSV41_FAIL(where, ": rtol without atol (allclose needs both)");
    if (m.empty()) DSV41_FAIL(where, ": no bound");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Cache layouts.

namespace {

// Value bytes per entry of a packed format (the scales follow them in the interleaved entry);
// 0 for a layout without scales (bf16, the compressor's fp32 rows).
int64_t value_bytes(const reference::model::CacheView& v) {
  if (v.kind == "compressor") return 0;
  switch (v.format) {
    case formats::CacheFormat::kCompressedKvFp4:
    case formats::CacheFormat::kIndexKeysFp4: return v.dim / 2;
    case formats::CacheFormat::kWindowKvFp8: return v.dim;
    case formats::CacheFormat::kBf16: return 0;
  }
  return 0;
}

// Interleaved entries [values | scales] regrouped from block-planar pages, or the inverse
// (formats/cache_layout.h: the same byte work the dump's block_planar layouts are read with).
std::vector<uint8_t> regroup(const reference::model::CacheView& v, const std::vector<uint8_t>& bytes, int64_t page,
                             bool to_planar) {
  return to_planar ? formats::to_block_planar(bytes, v.entries, v.entry_bytes, value_bytes(v), page)
                   : formats::from_block_planar(bytes, v.entries, v.entry_bytes, value_bytes(v), page);
}

struct Decoded {
  bool ok = false;
  std::string why;           // when !ok: why the bytes do not decode
  double nmse = 0;           // against the reference's values
  int64_t equal = 0, count = 0;
};

Decoded decode_against(const reference::model::CacheView& ref, const std::vector<uint8_t>& bytes,
                       const std::vector<float>& want) {
  Decoded d;
  std::vector<float> got;
  try {
    got = formats::unpack_rows(ref.format, bytes, static_cast<int>(ref.entries), static_cast<int>(ref.dim));
  } catch (const Error& e) {
    d.why = e.what();
    return d;
  }
  d.ok = true;
  double num = 0, den = 0;
  d.count = static_cast<int64_t>(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    d.equal += std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
    if (std::isfinite(got[i]) && std::isfinite(want[i])) {
      num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      den += double{want[i]} * want[i];
    } else if (!(std::isinf(got[i]) && got[i] == want[i])) {
      num = std::numeric_limits<double>::infinity();
    }
  }
  d.nmse = den > 0 ? num / den : num;
  return d;
}

std::string describe(const Decoded& d) {
  if (!d.ok) return "does not decode (" + d.why + ")";
  std::ostringstream s;
  s.precision(3);
  s << "NMSE " << d.nmse << ", " << d.equal << " of " << d.count << " values equal";
  return s.str();
}

}  // namespace

std::vector<uint8_t> to_block_planar(const reference::model::CacheView& v, int64_t page) {
  DSV41_CHECK(page >= 1 && value_bytes(v) > 0 && static_cast<int64_t>(v.bytes.size()) == v.entries * v.entry_bytes,
              "to_block_planar: cache ", v.kind, " of layer ", v.layer, " (", formats::info(v.format).name,
              ") has no value/scale split, or ", v.bytes.size(), " bytes for ", v.entries, " entries");
  return regroup(v, v.bytes, page, true);
}

std::string diagnose_cache_layout(const reference::model::CacheView& ref, const reference::model::CacheView& port) {
  if (ref.bytes == port.bytes) return "";
  if (ref.bytes.size() != port.bytes.size() || ref.entry_bytes != port.entry_bytes) {
    return std::to_string(port.entries) + " entries of " + std::to_string(port.entry_bytes) + " bytes, the reference " +
           std::to_string(ref.entries) + " of " + std::to_string(ref.entry_bytes);
  }
  const int64_t vb = value_bytes(ref);
  if (vb == 0 || ref.entries < 2) return "values differ (" + std::string(formats::info(ref.format).name) + ")";
  // Regrouping the port's bytes as block-planar pages of P entries gives the reference's bytes.
  std::vector<int64_t> pages;
  for (int64_t p = 2; p < ref.entries; p *= 2) pages.push_back(p);
  pages.push_back(ref.entries);
  for (int64_t p : pages) {
    if (regroup(ref, port.bytes, p, false) == ref.bytes) {
      return "written block-planar (pages of " + std::to_string(p) + " entries: their " + std::to_string(vb) +
             "-byte values, then their " + std::to_string(ref.entry_bytes - vb) +
             "-byte scales), read token-interleaved: regrouped, the bytes equal the reference's";
    }
  }
  // FP4: the two nibbles of every value byte swapped.
  if (ref.format == formats::CacheFormat::kCompressedKvFp4 || ref.format == formats::CacheFormat::kIndexKeysFp4) {
    std::vector<uint8_t> swapped = port.bytes;
    for (int64_t e = 0; e < ref.entries; ++e) {
      for (int64_t i = 0; i < vb; ++i) {
        uint8_t& x = swapped[static_cast<size_t>(e * ref.entry_bytes + i)];
        x = static_cast<uint8_t>((x >> 4) | (x << 4));
      }
    }
    if (swapped == ref.bytes) return "FP4 nibbles swapped (element 2i in the high nibble): swapped back, the bytes equal the reference's";
  }
  // Neither explains it: how close each decode comes.
  const std::vector<float> want =
      formats::unpack_rows(ref.format, ref.bytes, static_cast<int>(ref.entries), static_cast<int>(ref.dim));
  const Decoded inter = decode_against(ref, port.bytes, want);
  Decoded best_planar;
  int64_t best_page = 0;
  for (int64_t p : pages) {
    const Decoded d = decode_against(ref, regroup(ref, port.bytes, p, false), want);
    if (best_page == 0 || (d.ok && (!best_planar.ok || d.nmse < best_planar.nmse))) {
      best_planar = d;
      best_page = p;
    }
  }
  return "no layout explains it: decoded token-interleaved " + describe(inter) + "; decoded block-planar (pages of " +
         std::to_string(best_page) + ") " + describe(best_planar);
}

// ---------------------------------------------------------------------------------------------
bool conform_detail::is_comb(const std::string& c) {
  using reference::model::Component;
  for (Component k : {Component::kHcAttnComb, Component::kHcFfnComb, Component::kDSparkHcAttnComb,
                      Component::kDSparkHcFfnComb}) {
    if (c == reference::model::name(k)) return true;
  }
  return false;
}

// Failure details.

// What a failing item shows: where the values first differ, or the cache layout diagnosis.
std::string conform_detail::item_detail(const runner::StepCapture& a, const runner::StepCapture& b, int layer, const std::string& c,
                        const reference::ModelConfig& cfg) {
  std::ostringstream d;
  d.precision(6);
  const std::string what = c + " (" + conform_detail::layer_word(layer) + ")";
  try {
    if (conform_detail::is_cache(c)) {
      for (size_t i = 0; i < a.caches.size() && i < b.caches.size(); ++i) {
        if (a.caches[i].layer != layer || "cache." + a.caches[i].kind != c) continue;
        if (a.caches[i].entry_bytes == b.caches[i].entry_bytes && a.caches[i].bytes.size() == b.caches[i].bytes.size()) {
          const judge::BytesMetrics m = judge::compare_bytes(a.caches[i].bytes, b.caches[i].bytes, a.caches[i].entry_bytes, what);
          if (m.first_mismatch_entry >= 0) {
            d << "first mismatch in entry " << m.first_mismatch_entry << " byte " << m.first_mismatch_byte << " ("
              << (m.entries - m.entries_equal) << " of " << m.entries << " entries differ); ";
          }
        }
        d << diagnose_cache_layout(a.caches[i], b.caches[i]);
      }
      return d.str();
    }
    if (c == reference::model::name(reference::model::Component::kLogits)) {
      const judge::LogitMetrics m = judge::compare_logits(a.logits, b.logits, 0.0);
      d << "top-1 ref=" << m.top1_a << " port=" << m.top1_b << ", max |d| " << m.max_abs << ", NMSE " << m.nmse
        << ", KL " << m.kl;
      return d.str();
    }
    const runner::CapturedItem* ia = a.find(layer, c);
    const runner::CapturedItem* ib = b.find(layer, c);
    if (ia == nullptr || ib == nullptr) return ia ? "the port has no " + what : "the reference has no " + what;
    switch (ia->kind) {
      case runner::CapturedItem::kFloat: {
        const judge::TensorMetrics m = compare_tensors(ia->f, ib->f, ia->type, what);
        const judge::PortMetrics p = judge::port_metrics(ia->f.data(), ib->f.data(), 0, 0, what);
        if (m.first_mismatch >= 0) {
          d << "first mismatch at [";
          for (size_t k = 0; k < m.first_mismatch_coord.size(); ++k) d << (k ? ", " : "") << m.first_mismatch_coord[k];
          d << "] byte " << m.first_mismatch_byte << ": ref=" << m.a_at_first << " port=" << m.b_at_first << "; ";
        }
        d << (m.count - m.bit_equal) << " of " << m.count << " differ, max ulp " << m.max_ulp << ", NMSE " << m.nmse
          << ", calc_diff " << p.calc_diff;
        if (m.nan_mismatch + m.inf_mismatch > 0) d << "; " << m.nan_mismatch << " NaN / " << m.inf_mismatch << " Inf masks differ";
        if (m.bit_equal < m.count) d << "; " << judge::describe(judge::error_shape(ia->f.data(), ib->f.data(), ia->type, what));
        if (conform_detail::is_comb(c) && m.bit_equal < m.count) {
          d << "; " << judge::describe(judge::comb_colsum(ia->f.data(), ib->f.data(), cfg.hc_mult, cfg.hc_eps, what));
        }
        return d.str();
      }
      case runner::CapturedItem::kIndex: {
        const runner::CapturedItem* s = c == "topk" ? a.find(layer, "index_scores") : nullptr;
        const judge::IndexMetrics m = judge::compare_index_sets(ia->i, ib->i, s && s->f.dim(0) == ia->i.dim(0) ? &s->f : nullptr, 0.0, what);
        if (m.first_row_differs >= 0) {
          const judge::IndexRowMetrics& r = m.per_row[static_cast<size_t>(m.first_row_differs)];
          d << "first differing row " << m.first_row_differs << " (position "
            << a.start_pos + m.first_row_differs << "): Jaccard " << r.jaccard << ", recall " << r.recall;
          if (s != nullptr) {
            d << (m.tie_equivalent ? "; every difference inside the tie band (another tie rule: the reference's "
                                     "lower position wins)"
                                   : "; differences outside the tie band");
          }
        }
        d << "; " << (m.rows - m.rows_equal) << " of " << m.rows << " rows differ";
        return d.str();
      }
      case runner::CapturedItem::kMask: {
        const judge::CandidateMetrics m = judge::compare_candidates(ia->m, ib->m, std::max(1, cfg.candidate_block_size), what);
        d << "first differing row " << m.first_row_differs << ", block recall min " << m.min_block_recall;
        if (const std::optional<judge::IndexMetrics> t =
                runner::candidate_block_ties(ia->m, ib->m, a, layer, cfg.candidate_block_size, 0.0, what)) {
          d << (t->tie_equivalent ? "; every differing block is an exact tie of A's block scores (another tie rule: "
                                    "the reference's lower block wins)"
                                  : "; blocks differ outside the exact ties of A's block scores (not a tie)");
        }
        d << "; " << (m.rows - m.rows_equal) << " of " << m.rows << " rows differ";
        return d.str();
      }
      case runner::CapturedItem::kIds: {
        const judge::IntMetrics m = judge::compare_ints(ia->ids, ib->ids, what);
        d << "first mismatch at flat index " << m.first_mismatch << " (" << (m.count - m.equal) << " of " << m.count
          << " differ)";
        return d.str();
      }
    }
  } catch (const Error& e) {
    return std::string("not comparable: ") + e.what();
  }
  return "";
}

}  // namespace dsv41::scenarios::conform
