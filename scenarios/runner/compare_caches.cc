// scenarios/runner/compare_caches.cc
//
// The caches of a step compared (scenarios/runner/compare.h): presence and format, every entry
// valid (exact under any claim), the bytes, and what they decode to (decoded_rowrel,
// decoded_block_gain: an order-variant pair's derived cache bound judges them).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/cache_format.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/runner/compare_internal.h"

namespace dsv41::scenarios::runner::compare_detail {

void compare_caches(const StepCapture& a, const StepCapture& b, Rows& rows, StepComparison& out) {
  // A cache one side has and the other lacks, or holds in another format: a failure for a pair
  // that must match (bitexact: same bytes; tolerance: same caches), a note for a measured one.
  const auto missing = [&](int layer, const std::string& c, const std::string& why) {
    rows.add(layer, c, "present", 0.0, rows.stated_exact(true, 1.0), std::nullopt, why);
    out.notes.push_back(c + " layer " + std::to_string(layer) + " not compared: " + why);
  };
  if (a.caches.size() != b.caches.size()) {
    missing(-1, "cache", std::to_string(a.caches.size()) + " vs " + std::to_string(b.caches.size()) + " caches");
    return;
  }
  for (size_t i = 0; i < a.caches.size(); ++i) {
    const reference::model::CacheView& ca = a.caches[i];
    const reference::model::CacheView& cb = b.caches[i];
    const std::string c = "cache." + ca.kind;
    if (ca.kind != cb.kind || ca.layer != cb.layer) {
      missing(ca.layer, c, "side B's cache " + std::to_string(i) + " is " + cb.kind + " of layer " + std::to_string(cb.layer));
      continue;
    }
    if (ca.entry_bytes != cb.entry_bytes) {
      out.notes.push_back(c + " layer " + std::to_string(ca.layer) + " not compared: the formats differ (" +
                          std::to_string(ca.entry_bytes) + " vs " + std::to_string(cb.entry_bytes) + " bytes per entry)");
      rows.add(ca.layer, c, "format_equal", 0.0, rows.stated_exact(true, 1.0), std::nullopt,
               "entry bytes " + std::to_string(ca.entry_bytes) + " vs " + std::to_string(cb.entry_bytes));
      continue;
    }
    if (ca.bytes.size() != cb.bytes.size()) {
      rows.add(ca.layer, c, "entries_equal_frac", 0.0, rows.stated_exact(true, 1.0), std::nullopt,
               std::to_string(ca.entries) + " vs " + std::to_string(cb.entries) + " entries");
      continue;
    }
    // Every entry decodes on both sides (positive finite scales, no NaN codes): exact under any
    // claim. The compressors' pending fp32 rows are not a packed format (nothing to check).
    if (ca.kind != "compressor") {
      double valid = 1.0;
      std::string why;
      for (const reference::model::CacheView* v : {&cb, &ca}) {
        const formats::EntryCheck e =
            formats::check_entries(v->format, v->bytes, static_cast<int>(v->entries), static_cast<int>(v->dim));
        if (e.invalid == 0) continue;
        valid = std::min(valid, 1.0 - static_cast<double>(e.invalid) / static_cast<double>(e.rows));
        if (why.empty()) {
          why = std::string(v == &cb ? "side B" : "side A") + ": " + std::to_string(e.invalid) + " of " +
                std::to_string(e.rows) + " entries invalid; entry " + std::to_string(e.first);
          if (e.first < static_cast<int64_t>(v->positions.size())) {
            why += " (position " + std::to_string(v->positions[static_cast<size_t>(e.first)]) + ")";
          }
          why += ": " + e.why;
        }
      }
      rows.add(ca.layer, c, "valid_entries_frac", valid, rows.stated_exact(true, 1.0),
               judge::make_tolerance(1.0, true, "analytic",
                                     "a stored entry decodes (positive finite scales, no NaN or Inf codes) "
                                     "whatever order the port sums in: exact under any claim"),
               why);
    }
    const judge::BytesMetrics m = judge::compare_bytes(ca.bytes, cb.bytes, ca.entry_bytes, c + " layer " + std::to_string(ca.layer));
    std::string d;
    if (m.first_mismatch_entry >= 0) {
      d = "first mismatch in entry " + std::to_string(m.first_mismatch_entry) + " byte " +
          std::to_string(m.first_mismatch_byte);
      if (!ca.positions.empty() && m.first_mismatch_entry < static_cast<int64_t>(ca.positions.size())) {
        d += " (position " + std::to_string(ca.positions[static_cast<size_t>(m.first_mismatch_entry)]) + ")";
      }
    }
    rows.add(ca.layer, c, "bytes_equal_frac",
             m.bytes ? static_cast<double>(m.bytes_equal) / static_cast<double>(m.bytes) : 1.0,
             rows.stated_exact(true, 1.0), std::nullopt, d);
    // The compressor's pending rows are fp32 [kv | score] (2 rows of dim per entry): compared as
    // float rows, max_rowrel and row_gain per row (conform's order-variant claim bounds them).
    if (ca.kind == "compressor" && ca.dim > 0 && ca.entry_bytes == cb.entry_bytes && ca.entry_bytes == 8 * ca.dim &&
        ca.bytes.size() == cb.bytes.size() && m.bytes_equal < m.bytes) {
      std::vector<float> fa(ca.bytes.size() / 4), fb(cb.bytes.size() / 4);
      std::memcpy(fa.data(), ca.bytes.data(), ca.bytes.size());
      std::memcpy(fb.data(), cb.bytes.data(), cb.bytes.size());
      rows.add(ca.layer, c, judge::kDecodedRowRelMetric, judge::max_row_relative(fa, fb, ca.dim, c), std::nullopt,
               std::nullopt, "the pending fp32 rows (kv, score), per row of dim values");
      rows.add(ca.layer, c, judge::kRowGainMetric, judge::max_row_gain(fa, fb, ca.dim, c), std::nullopt, std::nullopt,
               "the pending fp32 rows' gain error (kv, score rows of dim values)");
    }
    // What the bytes decode to, per entry relative to the entry's max |A| (measured here; conform's
    // order-variant claim bounds it: judge::derived_cache_bound). Decoded only where bytes differ.
    if (ca.kind != "compressor" && ca.format == cb.format && ca.dim > 0 && ca.entries > 0) {
      double rel = 0, block_gain = 0;
      std::string why;
      if (m.bytes_equal < m.bytes) {
        try {
          const int n = static_cast<int>(ca.entries), dim = static_cast<int>(ca.dim);
          const std::vector<float> da = formats::unpack_rows(ca.format, ca.bytes, n, dim);
          const std::vector<float> db = formats::unpack_rows(cb.format, cb.bytes, n, dim);
          int64_t worst = -1;
          for (int64_t e = 0; e < ca.entries; ++e) {
            const std::vector<float> ra(da.begin() + e * dim, da.begin() + (e + 1) * dim);
            const std::vector<float> rb(db.begin() + e * dim, db.begin() + (e + 1) * dim);
            const double r = judge::max_row_relative(ra, rb, dim, c);
            if (r > rel) rel = r, worst = e;
          }
          if (worst >= 0) {
            why = "worst entry " + std::to_string(worst);
            if (worst < static_cast<int64_t>(ca.positions.size())) {
              why += " (position " + std::to_string(ca.positions[static_cast<size_t>(worst)]) + ")";
            }
            why += ": max |decoded A - decoded B| = " + std::to_string(rel) + " x the entry's max |decoded A|";
          }
          const int block = formats::info(ca.format).block;
          if (block > 1 && dim % block == 0) block_gain = judge::max_row_gain(da, db, block, c);
        } catch (const Error&) {
          continue;  // an entry that does not decode: valid_entries_frac (above) fails and says which
        }
      }
      rows.add(ca.layer, c, judge::kDecodedRowRelMetric, rel, std::nullopt, std::nullopt, why);
      rows.add(ca.layer, c, judge::kDecodedBlockGainMetric, block_gain, std::nullopt, std::nullopt,
               block_gain > 0 ? "a scale block's decoded values scaled by about 1 + " + std::to_string(block_gain) +
                                    " or more (a wrong block scale?)"
                              : "");
    }
  }
}

}  // namespace dsv41::scenarios::runner::compare_detail
