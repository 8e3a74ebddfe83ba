// reference/ops/indexer_fast.h: what reference/ops/indexer.cc (the double path, scores16) and
// reference/ops/indexer_fast.cc (the integer path) share. Internal to index_scores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
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

// index_scores' input checks (ranks, shapes, every reach in [0, N]), errors prefixed with `what`.
void check_score_inputs(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                        const std::vector<int64_t>& reach, const char* what);

// The keys of one call encoded for the integer path (encode_keys): [groups of 16, pairs, 16, 2]
// int16 codes, 2^ek per key, and per group whether every key of it is encoded.
struct EncodedKeys {
  int64_t reached = 0;           // keys [0, reached) encoded (the largest reach of the call)
  int64_t pairs = 0;             // ceil(d / 2)
  std::vector<int16_t> codes;    // [groups, pairs, 16, 2] (the kernels' kc; zeros past `reached`)
  std::vector<double> scale;     // [groups, 16] 2^ek (0 past `reached`)
  std::vector<uint8_t> encoded;  // [groups] every reached key of the group encoded
};
EncodedKeys encode_keys(const Tensor<float>& keys, int64_t reached);

// What a caller of integer_path_rows / double_path_rows asks for: query rows [t0, t1) of a [T, N]
// score computation (width = N) into out [(t1 - t0), N] (row t at out + (t - t0) * N); with `fill`, each row is
// first set to -inf by the worker that scores it (a parallel first touch), else it must be preset.
// `done(a, b)`, when set, runs on the worker that scored rows [a, b) right after them, so a fused
// consumer (index_select_by_rows) reads them while they are in cache.
struct ScoreRows {
  int64_t t0 = 0, t1 = 0;
  int64_t width = 0;  // N
  float* out = nullptr;
  bool fill = false;
  std::function<void(int64_t, int64_t)> done;
};

// The scores of those rows (inside the pool where pool is non-null) by the integer path; q, keys,
// weights and reach already checked, k = encode_keys(keys, r) with r >= the rows' largest reach.
// Requires integer_path_fits(d). Pairs it cannot encode go through scores16.
void integer_path_rows(const Tensor<float>& q, const Tensor<float>& keys, const EncodedKeys& k,
                       const Tensor<float>& weights, const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool,
                       const ScoreRows& rows, IndexScoresTally& tally);

// The keys transposed in groups of 16 for scores16: [groups, d, 16] (zeros past `reached`).
std::vector<float> transposed_keys(const Tensor<float>& keys, int64_t reached);

// The same rows by the double path (scores16 on every group), kt = transposed_keys(keys, r).
void double_path_rows(const Tensor<float>& q, const std::vector<float>& kt, const Tensor<float>& weights,
                      const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool, const ScoreRows& rows,
                      IndexScoresTally& tally);

// One row's selections from its scores s [n] (reach = the row's reach), as select_candidate_blocks
// and select_index_topk make them for that row: the candidate mask row [n] (block scratch [blocks]),
// and the top-k row [k] (ascending positions, -1 past the reach).
void candidate_row(const float* s, int64_t n, int64_t reach, int topk_blocks, int block_size, float* block_scratch,
                   uint8_t* mask);
void topk_row(const float* s, int64_t n, int64_t reach, int64_t k, int64_t offset, int32_t* idxs);

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
