// reference/ops/indexer_fast.h: what reference/ops/indexer.cc (the double path, scores16) and
// reference/ops/indexer_fast.cc (the integer path) share. Internal to index_scores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "reference/ops/indexer.h"
#include "reference/ops/numerics.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference::indexer_detail {

// The scores of 16 keys for one query by the double path (indexer.cc): q [heads, d] and w [heads]
// of the query, kt the 16 keys transposed (kt[i * 16 + lane] = key lane's value i) -> out [16].
// (Cloned where it is defined: DSV41_SIMD_CLONES, numerics.h says why not here.)
void scores16(const float* q, const float* w, const float* kt, int64_t heads, int64_t d, float* out);

// Whether the integer path takes rows of d channels (d * 2047^2 must stay below 2^31).
bool integer_path_fits(int64_t d);

// The integer path's kernels this CPU runs (generic, avx2, avx512bw, avx512vnni; the best last),
// and a test's choice of one ("" restores the best). They give the same bits (indexer_fast.cc).
std::vector<std::string> integer_path_kernels();
void set_integer_path_kernel(const std::string& name);

// The scores of every (query, reachable key) pair (inside the pool where pool is non-null) by the
// integer path, into scores [T, N] preset to -inf; q, keys, weights and reach already checked.
// Requires integer_path_fits(d). Pairs it cannot encode go through scores16.
void integer_path_scores(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                         const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool, Tensor<float>& scores,
                         IndexScoresTally& tally);

// Whether none of the `width` keys from `first` lies in the pool row (null: every key does).
inline bool group_outside_pool(const uint8_t* in_pool, int64_t first, int64_t width) {
  return in_pool != nullptr && std::none_of(in_pool + first, in_pool + first + width, [](uint8_t m) { return m != 0; });
}

// Writes the `width` scores of a group from `first` into out [N]: s16 where the pool allows, -inf elsewhere.
inline void store_group(const float* s16, const uint8_t* in_pool, int64_t first, int64_t width, float* out) {
  for (int64_t l = 0; l < width; ++l) {
    out[first + l] = in_pool == nullptr || in_pool[first + l] != 0 ? s16[l] : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace dsv41::reference::indexer_detail
