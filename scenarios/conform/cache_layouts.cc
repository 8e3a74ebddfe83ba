// scenarios/conform/cache_layouts.cc: a port dump's cache layouts read into canonical entries, and
// the judgement by value of a cache whose entry format is not the reference's
// (scenarios/conform/cache_layouts.h, docs/port-dump.md "Cache layouts").
#include "scenarios/conform/cache_layouts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "formats/cache_format.h"

namespace dsv41::scenarios::conform {

using reference::DType;
using reference::checkpoint::safetensors::Entry;

namespace {

constexpr const char* kLayoutForms = "canonical, block_planar:<P>, paged, paged_block_planar";

// A count written in decimal ("16"); `what` names it in the error.
int64_t parse_count(const std::string& text, const std::string& what) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  DSV41_CHECK(used > 0 && used == text.size() && v >= 0 && text[0] != '+' && text[0] != ' ', what, " is '", text,
              "', not an integer >= 0");
  return v;
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& name, bool required,
                 int64_t fallback) {
  const auto it = meta.find(name);
  if (it == meta.end()) {
    DSV41_CHECK(!required, "metadata '", name, "' is missing (the layout needs it)");
    return fallback;
  }
  return parse_count(it->second, "metadata '" + name + "'");
}

}  // namespace

bool is_sparse_mla_fp8(const std::string& label) {
  formats::SparseMlaFp8 f;
  return formats::sparse_mla_fp8_from_name(label, f);
}

CacheLayout cache_layout(const std::map<std::string, std::string>& meta, const std::string& key) {
  CacheLayout l;
  const auto it = meta.find(key + ".layout");
  if (it == meta.end() || it->second == kLayoutCanonical) return l;
  const std::string& name = it->second;
  const std::string planar = std::string(kLayoutBlockPlanar) + ":";
  if (name.rfind(planar, 0) == 0) {
    l.kind = CacheLayout::kBlockPlanar;
    l.page = parse_count(name.substr(planar.size()), "the page size of metadata '" + key + ".layout'");
    DSV41_CHECK(l.page >= 1, "metadata '", key, ".layout' is '", name, "': pages of at least one entry");
    return l;
  }
  if (name == kLayoutPaged || name == kLayoutPagedBlockPlanar) {
    l.kind = name == kLayoutPaged ? CacheLayout::kPaged : CacheLayout::kPagedBlockPlanar;
    l.block_size = meta_int(meta, key + ".block_size", true, 0);
    l.entries = meta_int(meta, key + ".entries", true, 0);
    l.first = meta_int(meta, key + ".first", false, 0);
    DSV41_CHECK(l.block_size >= 1, "metadata '", key, ".block_size' is 0");
    return l;
  }
  DSV41_FAIL("metadata '", key, ".layout' is '", name, "', not a cache layout (known: ", kLayoutForms, ")");
}

std::string describe(const CacheLayout& l) {
  switch (l.kind) {
    case CacheLayout::kCanonical: return kLayoutCanonical;
    case CacheLayout::kBlockPlanar: return std::string(kLayoutBlockPlanar) + ":" + std::to_string(l.page);
    case CacheLayout::kPaged:
    case CacheLayout::kPagedBlockPlanar:
      return std::string(l.kind == CacheLayout::kPaged ? kLayoutPaged : kLayoutPagedBlockPlanar) + " (block_size " +
             std::to_string(l.block_size) + ", " + std::to_string(l.entries) + " entries from slot " +
             std::to_string(l.first) + ")";
  }
  return "";
}

int64_t label_entry_bytes(const std::string& label, int64_t dim, const reference::ModelConfig& c) {
  DSV41_CHECK(dim > 0 && dim <= (int64_t{1} << 20), "dim ", dim);
  if (label == "fp32") return 8 * dim;  // the compressor's pending rows
  formats::SparseMlaFp8 f;
  if (formats::sparse_mla_fp8_from_name(label, f)) {
    return formats::sparse_mla_fp8_entry_bytes(f, static_cast<int>(dim), c.rope_head_dim);
  }
  return formats::entry_bytes(formats::cache_format_from_name(label), static_cast<int>(dim));
}

void canonicalize_cache(const reference::ModelConfig& c, const std::map<std::string, std::string>& meta,
                        std::map<std::string, Entry>& tensors, const std::string& key, const std::string& where) {
  const std::string table_key = key + kBlockTableSuffix;
  try {
    const CacheLayout l = cache_layout(meta, key);
    Entry& e = tensors.at(key);
    const bool has_table = tensors.count(table_key) > 0;
    const auto label = meta.find(key + ".format");
    const auto dim_s = meta.find(key + ".dim");
    if (l.kind == CacheLayout::kCanonical) {
      DSV41_CHECK(!has_table, "a block table '", table_key, "', but the layout is canonical (paged layouts: ",
                  kLayoutPaged, ", ", kLayoutPagedBlockPlanar, ")");
      if (label == meta.end() || !is_sparse_mla_fp8(label->second)) return;  // conform checks the rest (cache_of)
    }
    DSV41_CHECK(label != meta.end() && dim_s != meta.end(), "a layout other than canonical, or a sparse-MLA fp8 "
                "format, needs the metadata '", key, ".format' and '", key, ".dim'");
    DSV41_CHECK(e.dtype == DType::kU8, "dtype ", reference::dtype_name(e.dtype), ", a cache is U8");
    const int64_t dim = meta_int(meta, key + ".dim", true, 0);
    const int64_t eb = label_entry_bytes(label->second, dim, c);
    DSV41_CHECK(label->second != "fp32" || l.kind == CacheLayout::kCanonical,
                "the compressor's pending fp32 rows are canonical only, not ", describe(l));
    formats::SparseMlaFp8 mla{};
    const bool sparse_mla = formats::sparse_mla_fp8_from_name(label->second, mla);
    const int64_t vb =
        sparse_mla ? formats::sparse_mla_fp8_value_bytes(mla, static_cast<int>(dim), c.rope_head_dim)
                   : (label->second == "fp32"
                          ? 0
                          : formats::value_bytes(formats::cache_format_from_name(label->second), static_cast<int>(dim)));
    const bool planar = l.kind == CacheLayout::kBlockPlanar || l.kind == CacheLayout::kPagedBlockPlanar;
    DSV41_CHECK(!planar || vb > 0, "layout ", describe(l), " needs an entry of values then block scales, and format ",
                label->second, " has none");
    switch (l.kind) {
      case CacheLayout::kCanonical: break;
      case CacheLayout::kBlockPlanar:
        DSV41_CHECK(e.shape.size() == 2 && e.shape[1] == eb, "shape ", reference::shape_string(e.shape), ", layout ",
                    describe(l), " of format ", label->second, " dim ", dim, " is [entries, ", eb, "]");
        e.bytes = formats::from_block_planar(e.bytes, e.shape[0], eb, vb, l.page);
        break;
      case CacheLayout::kPaged:
      case CacheLayout::kPagedBlockPlanar: {
        DSV41_CHECK(has_table, "layout ", describe(l), " needs the block table '", table_key, "' (I32 [blocks])");
        const Entry& t = tensors.at(table_key);
        DSV41_CHECK(t.dtype == DType::kI32 && t.shape.size() == 1, "block table '", table_key, "': ",
                    reference::dtype_name(t.dtype), " ", reference::shape_string(t.shape), ", expected I32 [blocks]");
        std::vector<int32_t> table(static_cast<size_t>(t.shape[0]));
        if (!table.empty()) std::memcpy(table.data(), t.bytes.data(), table.size() * 4);
        // [num_blocks, block_size, E], or [num_blocks, B] with B = block_size * E plus a block's trailing
        // padding of less than one entry (FlashMLA pads a MODEL1 block to a multiple of 576 bytes).
        const int64_t block_bytes = l.block_size * eb;
        const bool fits = !e.shape.empty() &&
                          ((e.shape.size() == 3 && e.shape[1] == l.block_size && e.shape[2] == eb) ||
                           (e.shape.size() == 2 && e.shape[1] >= block_bytes && e.shape[1] < block_bytes + eb));
        DSV41_CHECK(fits, "shape ", reference::shape_string(e.shape), ", layout ", describe(l), " of format ",
                    label->second, " dim ", dim, " (", eb, " bytes an entry) is [num_blocks, ", l.block_size, ", ", eb,
                    "] or [num_blocks, ", block_bytes, " (+ a padding of less than one entry)]");
        std::vector<uint8_t> pool = std::move(e.bytes);
        if (e.shape.size() == 2 && e.shape[1] > block_bytes) {  // drop each block's padding
          std::vector<uint8_t> packed;
          packed.reserve(static_cast<size_t>(e.shape[0] * block_bytes));
          for (int64_t b = 0; b < e.shape[0]; ++b) {
            packed.insert(packed.end(), pool.begin() + b * e.shape[1], pool.begin() + b * e.shape[1] + block_bytes);
          }
          pool = std::move(packed);
        }
        e.bytes = formats::unpage(pool, e.shape[0], l.block_size, eb, table, l.first, l.entries,
                                  l.kind == CacheLayout::kPagedBlockPlanar ? vb : 0);
        e.shape = {l.entries, eb};
        tensors.erase(table_key);
        break;
      }
    }
    if (sparse_mla) {
      DSV41_CHECK(e.shape.size() == 2 && e.shape[1] == eb, "shape ", reference::shape_string(e.shape), ", format ",
                  label->second, " dim ", dim, " (RoPE ", c.rope_head_dim, ") has ", eb, " bytes an entry");
      formats::decode_sparse_mla_fp8(mla, e.bytes, static_cast<int>(e.shape[0]), static_cast<int>(dim), c.rope_head_dim);
    }
  } catch (const Error& x) {
    DSV41_FAIL(where, ": key '", key, "': ", x.what());
  }
}

ValueCache sparse_mla_fp8_cache(const Entry& e, int layer, const std::string& kind, const std::string& label,
                                int64_t dim, const std::vector<int64_t>& positions, const reference::ModelConfig& c) {
  formats::SparseMlaFp8 f{};
  DSV41_CHECK(formats::sparse_mla_fp8_from_name(label, f), "format '", label, "' is no sparse-MLA fp8 entry");
  ValueCache v;
  v.layer = layer;
  v.kind = kind;
  v.label = label;
  v.dim = dim;
  v.entries = e.shape.at(0);
  v.rows = formats::decode_sparse_mla_fp8(f, e.bytes, static_cast<int>(v.entries), static_cast<int>(dim), c.rope_head_dim);
  v.positions = positions;
  return v;
}

ValueCache value_cache(const reference::model::CacheView& cv) {
  ValueCache v;
  v.layer = cv.layer;
  v.kind = cv.kind;
  v.label = formats::info(cv.format).name;
  v.dim = cv.dim;
  v.entries = cv.entries;
  v.rows = formats::decode_with_rounding(cv.format, cv.bytes, static_cast<int>(cv.entries), static_cast<int>(cv.dim));
  v.positions = cv.positions;
  return v;
}

std::vector<reports::MetricRow> cache_value_rows(const reference::model::CacheView& ref, const ValueCache& port,
                                                 const reference::ModelConfig& c, bool order_variant,
                                                 judge::Accumulation acc, int64_t step, int64_t position,
                                                 std::string& detail) {
  const std::string component = "cache." + ref.kind;
  std::vector<reports::MetricRow> rows;
  const auto row = [&](const std::string& metric, double value) {
    reports::MetricRow r;
    r.step = step;
    r.position = position;
    r.layer = ref.layer;
    r.component = component;
    r.metric = metric;
    r.value = value;
    rows.push_back(r);
  };
  detail = "format differs (port " + port.label + ", reference " + formats::info(ref.format).name +
           "): judged by values";
  if (port.dim != ref.dim) {
    row("format_equal", 0.0);
    detail += "; but the port's entries hold " + std::to_string(port.dim) + " values, the reference's " +
              std::to_string(ref.dim);
    return rows;
  }
  row("entries_equal_frac", port.entries == ref.entries ? 1.0 : 0.0);
  if (port.entries != ref.entries) {
    detail += "; " + std::to_string(port.entries) + " entries, the reference " + std::to_string(ref.entries);
    return rows;
  }
  const formats::DecodedRows a = formats::decode_with_rounding(ref.format, ref.bytes, static_cast<int>(ref.entries),
                                                               static_cast<int>(ref.dim));
  double chain = 0;
  if (order_variant) {
    const std::optional<judge::DerivedBound> b = judge::derived_cache_chain_bound(c, component, acc);
    if (b) chain = b->bound;
  }
  double worst = 0;
  int64_t we = -1, wi = -1;
  double wa = 0, wb = 0, wallow = 0;
  const int64_t dim = ref.dim;
  for (int64_t e = 0; e < ref.entries; ++e) {
    double amax = 0;
    for (int64_t i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(double{a.values[static_cast<size_t>(e * dim + i)]}));
    for (int64_t i = 0; i < dim; ++i) {
      const size_t k = static_cast<size_t>(e * dim + i);
      const double x = a.values[k], y = port.rows.values[k];
      const double allow = double{a.rounding[k]} + double{port.rows.rounding[k]} + chain * amax;
      const double diff = std::fabs(x - y);
      // diff is NaN only for an Inf on a side (an E8M0-scaled value beyond bf16): equal Infs agree.
      const double ratio = x == y ? 0.0 : (std::isnan(diff) || allow <= 0 ? 1e300 : std::min(1e300, diff / allow));
      if (ratio > worst) worst = ratio, we = e, wi = i, wa = x, wb = y, wallow = allow;
    }
  }
  row(kDecodedRoundingRatioMetric, worst);
  if (we >= 0) {
    std::ostringstream s;
    s.precision(6);
    s << "; worst entry " << we;
    if (we < static_cast<int64_t>(ref.positions.size())) s << " (position " << ref.positions[static_cast<size_t>(we)] << ")";
    s << " value " << wi << ": ref " << wa << ", port " << wb << ", |d| = " << std::fabs(wa - wb) << " = " << worst
      << " x its allowance " << wallow << " (the reference's rounding + the port's"
      << (order_variant ? " + the chain's derived bound x the entry's max" : "") << ")";
    detail += s.str();
  }
  return rows;
}

reports::Tolerance decoded_rounding_ratio_tolerance() {
  reports::Tolerance t;
  t.bound = 1.0;
  t.higher_is_better = false;
  t.origin = "analytic";
  t.note = "docs/port-dump.md \"Cache layouts\": format differs, judged by values: each decoded value within the "
           "reference format's rounding plus the port format's rounding of it (half the wider code gap at its scale; "
           "bf16 values 0), plus under order-variant the chain's derived bound x the entry's max";
  return t;
}

}  // namespace dsv41::scenarios::conform
