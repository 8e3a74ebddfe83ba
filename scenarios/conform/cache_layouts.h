// scenarios/conform/cache_layouts.h
//
// A port dump's cache layouts (docs/port-dump.md "Cache layouts"): an engine hands over its cache
// as it keeps it, and names the layout in the step's metadata; read_port_dump turns every cache
// into canonical entries ([entries, entry_bytes] in canonical order) before anything is judged,
// with formats/cache_layout.h doing the byte work.
//
//   <key>.layout       canonical (default) | block_planar:<P> | paged | paged_block_planar
//   <key>.block_size   paged layouts: entries per block
//   <key>.entries      paged layouts: the valid entries, taken in block-table order
//   <key>.first        paged layouts, optional: the first valid slot of the first block (default 0)
//   <key>.block_table  paged layouts: a tensor, I32 [blocks], the request's block table
//   <key>.format       a formats::CacheFormat name, or a sparse-MLA fp8 entry of FlashMLA-based engines
//                      (formats::SparseMlaFp8: fp8_ds_mla, V3.2's 656 bytes; fp8_ds_mla_model1, V4's 584)
//
// A lossless layout (block_planar, paged) gives the canonical bytes, compared byte for byte as
// always. A cache whose entry format is not the reference's (fp8_ds_mla[_model1]; bf16, or any other
// CacheFormat, where the reference keeps FP4/FP8) has no bytes to compare: both sides are decoded
// and judged by value (cache_value_rows, metric decoded_rounding_ratio), the report saying
// "format differs: judged by values". Bytes that do not parse (a block table out of range or
// listing a block twice, a tensor of the wrong size for its layout, a sparse-MLA fp8 scale that is
// NaN, Inf or not positive, an unknown layout) are a dsv41::Error naming the key and the reason.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/cache_layout.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/model/kv_cache.h"
#include "reference/ops/config.h"
#include "reports/report.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::scenarios::conform {

inline constexpr const char* kLayoutCanonical = "canonical";
inline constexpr const char* kLayoutBlockPlanar = "block_planar";  // written "block_planar:<P>"
inline constexpr const char* kLayoutPaged = "paged";
inline constexpr const char* kLayoutPagedBlockPlanar = "paged_block_planar";
inline constexpr const char* kBlockTableSuffix = ".block_table";
// The row of a cache judged by value: max over its values of |decoded ref - decoded port| / the
// two formats' rounding at that value (+ the order-variant chain); bound 1.
inline constexpr const char* kDecodedRoundingRatioMetric = "decoded_rounding_ratio";

struct CacheLayout {
  enum Kind { kCanonical, kBlockPlanar, kPaged, kPagedBlockPlanar };
  Kind kind = kCanonical;
  int64_t page = 0;        // block_planar:<P>: entries per page
  int64_t block_size = 0;  // paged: entries per block
  int64_t entries = 0;     // paged: valid entries
  int64_t first = 0;       // paged: the first valid slot
};
// The layout a step's metadata gives `key` (canonical when it says none); a dsv41::Error naming
// the metadata key and the accepted forms otherwise.
CacheLayout cache_layout(const std::map<std::string, std::string>& meta, const std::string& key);
// "paged (block_size 16, 37 entries from slot 0)", "block_planar:8", "canonical".
std::string describe(const CacheLayout& l);

// Whether `label` names a sparse-MLA fp8 entry (formats::SparseMlaFp8): never a CacheView, always
// judged by value.
bool is_sparse_mla_fp8(const std::string& label);

// Bytes per entry of a cache labelled `label` with `dim` values (a sparse-MLA fp8 entry: its RoPE
// part is the last rope_head_dim values of the config; "fp32": the compressor's 8 * dim).
int64_t label_entry_bytes(const std::string& label, int64_t dim, const reference::ModelConfig& c);

// Rewrites tensors[key], the cache as the engine laid it out, into canonical [entries,
// entry_bytes] U8 and removes its `<key>.block_table`; checks sparse-MLA fp8 entries decode. A
// dsv41::Error "<where>: key '<key>': <reason>" for bytes that do not parse.
void canonicalize_cache(const reference::ModelConfig& c, const std::map<std::string, std::string>& meta,
                        std::map<std::string, reference::checkpoint::safetensors::Entry>& tensors,
                        const std::string& key, const std::string& where);

// A port cache judged by value: its label, its decoded values and their rounding bounds.
struct ValueCache {
  int layer = -1;
  std::string kind;   // "compressed_kv", ...
  std::string label;  // its entry format: fp8_ds_mla, fp8_ds_mla_model1, bf16, ...
  int64_t dim = 0, entries = 0;
  formats::DecodedRows rows;        // [entries, dim]
  std::vector<int64_t> positions;   // [entries] or empty
};
// A canonical sparse-MLA fp8 cache of a dump step (the tensor [entries, entry_bytes], its label and `.dim`).
ValueCache sparse_mla_fp8_cache(const reference::checkpoint::safetensors::Entry& e, int layer, const std::string& kind,
                                const std::string& label, int64_t dim, const std::vector<int64_t>& positions,
                                const reference::ModelConfig& c);
// A port cache of another CacheFormat than the reference's, decoded.
ValueCache value_cache(const reference::model::CacheView& v);

// The rows of a cache judged by value against the reference's cache `ref`: entries_equal_frac and
// format_equal (same entry count, same dim: exact), then decoded_rounding_ratio = max over values
// of |a - b| / (ref rounding + port rounding + chain x the entry's max |a|), chain = the
// order-variant claim's derived_cache_chain_bound (0 under bit-exact). `detail` gets what the
// report shows ("format differs (port fp8_ds_mla, reference fp4_e2m1_e4m3_b16): judged by values;
// worst ...").
std::vector<reports::MetricRow> cache_value_rows(const reference::model::CacheView& ref, const ValueCache& port,
                                                 const reference::ModelConfig& c, bool order_variant,
                                                 judge::Accumulation acc, int64_t step, int64_t position,
                                                 std::string& detail);
// decoded_rounding_ratio's bound: 1, analytic, with its origin.
reports::Tolerance decoded_rounding_ratio_tolerance();

}  // namespace dsv41::scenarios::conform
