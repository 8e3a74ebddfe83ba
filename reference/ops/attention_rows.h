// reference/ops/attention_rows.h: the compressed entries one sparse_attn call reads.
//
// A sparse_attn call's indices name rows of [window rows | compressed entries]: row r < W is window
// row r, row W + e is compressed entry e, -1 is no row. The op reads every compressed entry
// (read_all_entries, the readable form); each output only depends on the rows its indices name, in
// index order, so the backends (the reference's seam since session 21, both CUDA backends since
// session 18) read just the entries some index names, in ascending order, and renumber the indices
// to them: the same rows in the same order, the same bits, and a decode step reads O(index_topk)
// entries per layer instead of O(context) (bench/RESULTS.md, sessions 18 and 21).
//
//   idx  [T * K] int32 in [-1, W + count) (the caller has checked)  ->  renumbered in place:
//        r < W unchanged; W + e  ->  W + (rank of e among the entries read)
//   returns the entries read, ascending, each once
//
// tests/reference/ops/attention_rows_test.cc: the renumbering, and the reference's sparse_attn on the
// compacted rows equal to it on the whole cache, bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dsv41::reference {

// Whether every index lies in [-1, W + count): what compact_attention_rows needs (sparse_attn
// itself names a bad index in its error).
inline bool attention_rows_in_range(const std::vector<int32_t>& idx, int64_t W, int64_t count) {
  return std::all_of(idx.begin(), idx.end(), [&](int32_t r) { return r >= -1 && r < W + count; });
}

inline std::vector<int64_t> compact_attention_rows(std::vector<int32_t>& idx, int64_t W, int64_t count) {
  if (count <= 0) return {};
  if (count > 4 * static_cast<int64_t>(idx.size())) {
    // A long cache and few indices (a decode step at a long context): O(K log K), not O(count).
    std::vector<int64_t> used;
    for (int32_t r : idx) {
      if (r >= W) used.push_back(r - W);
    }
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    for (int32_t& r : idx) {
      if (r >= W) {
        const auto at = std::lower_bound(used.begin(), used.end(), static_cast<int64_t>(r - W));
        r = static_cast<int32_t>(W + (at - used.begin()));
      }
    }
    return used;
  }
  std::vector<int32_t> slot(static_cast<size_t>(count), -1);  // entry -> its row among the read
  for (int32_t r : idx) {
    if (r >= W) slot[static_cast<size_t>(r - W)] = 0;  // named
  }
  std::vector<int64_t> used;
  for (int64_t e = 0; e < count; ++e) {
    if (slot[static_cast<size_t>(e)] == 0) {
      slot[static_cast<size_t>(e)] = static_cast<int32_t>(W + static_cast<int64_t>(used.size()));
      used.push_back(e);
    }
  }
  for (int32_t& r : idx) {
    if (r >= W) r = slot[static_cast<size_t>(r - W)];
  }
  return used;
}

}  // namespace dsv41::reference
