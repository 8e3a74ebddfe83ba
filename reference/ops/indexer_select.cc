// reference/ops/indexer_select.cc: index_select_by_rows, the indexer's selection without its [T, N]
// score tensor (indexer.h). The outputs are the composition's bit for bit because nothing crosses
// query rows: a row's scores depend on its q, weights, reach and pool row (index_scores), its
// candidate blocks and top-k on its scores and reach alone (candidate_row and topk_row are the very
// row functions select_candidate_blocks and select_index_topk run). Only where the scores live
// changes: a tile of rows in one buffer, reused, each row filled with -inf by the worker that scores
// it and read back by the same worker right after (ScoreRows::done).
#include <algorithm>
#include <memory>

#include "base/error.h"
#include "reference/ops/indexer.h"
#include "reference/ops/indexer_fast.h"

namespace dsv41::reference {

IndexSelection index_select_by_rows(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                                    const std::vector<int64_t>& reach, const IndexSelectSpec& spec,
                                    IndexScoresPath path, int64_t rows_per_tile, IndexScoresTally* tally) {
  indexer_detail::check_score_inputs(q, keys, weights, reach, "index_select");
  const int64_t t_count = q.dim(0), d = q.dim(2), n = keys.dim(0);
  DSV41_CHECK(t_count == 0 || reach.back() == n, "index_select: ", n, " keys but the last query reaches ",
              reach.back(), " (the keys must be end_pos / ratio)");
  DSV41_CHECK(spec.index_topk > 0 && rows_per_tile >= 0, "index_select: index_topk ", spec.index_topk,
              ", rows_per_tile ", rows_per_tile);
  const bool source = spec.candidate_topk_blocks > 0;
  DSV41_CHECK(!(source && spec.pool != nullptr),
              "index_select: a layer is either the candidate source or inside its pool, not both");
  DSV41_CHECK(!source || spec.candidate_block_size > 0, "index_select: candidate block size ",
              spec.candidate_block_size);
  DSV41_CHECK(spec.pool == nullptr || (spec.pool->rank() == 2 && spec.pool->dim(0) == t_count &&
                                       spec.pool->dim(1) == n),
              "index_select: the pool ", spec.pool != nullptr ? shape_string(spec.pool->shape()) : "",
              " must be [T, N] = [", t_count, ", ", n, "]");

  const int64_t k = std::min<int64_t>(spec.index_topk, n);
  IndexSelection out;
  out.topk = Tensor<int32_t>({t_count, k}, "indexer_topk");
  if (source) out.candidates = Tensor<uint8_t>({t_count, n}, "candidates");
  IndexScoresTally count;
  if (t_count == 0) {
    if (tally != nullptr) *tally = count;
    return out;
  }

  // The tile: at least 8 rows a thread (the integer path's query blocks), at most 256 MiB of scores.
  int64_t tile = rows_per_tile;
  if (tile == 0) {
    const int64_t budget = (int64_t{256} << 20) / (4 * std::max<int64_t>(n, 1));
    tile = std::max<int64_t>(8 * reference_threads(), budget);
  }
  tile = std::clamp<int64_t>(tile, 1, t_count);
  // [tile, N] fp32, not value-initialized: each row is set by the worker that scores it (fill).
  const std::unique_ptr<float[]> buffer(new float[static_cast<size_t>(tile * std::max<int64_t>(n, 1))]);
  const int64_t reached = *std::max_element(reach.begin(), reach.end());
  const bool integer = path == IndexScoresPath::kInteger && indexer_detail::integer_path_fits(d);
  indexer_detail::EncodedKeys encoded;
  std::vector<float> transposed;
  if (integer) {
    encoded = indexer_detail::encode_keys(keys, reached);  // once for every tile
  } else {
    transposed = indexer_detail::transposed_keys(keys, reached);
  }
  const int64_t blocks = source ? (n + spec.candidate_block_size - 1) / spec.candidate_block_size : 0;
  for (int64_t t0 = 0; t0 < t_count; t0 += tile) {
    indexer_detail::ScoreRows rows;
    rows.t0 = t0;
    rows.t1 = std::min(t_count, t0 + tile);
    rows.width = n;
    rows.out = buffer.get();
    rows.fill = true;
    rows.done = [&](int64_t a, int64_t b) {  // on the worker that scored rows [a, b)
      std::vector<float> block_scratch(static_cast<size_t>(blocks));
      for (int64_t t = a; t < b; ++t) {
        const float* s = buffer.get() + (t - t0) * n;
        const int64_t reach_t = reach[static_cast<size_t>(t)];
        if (source) {
          indexer_detail::candidate_row(s, n, reach_t, spec.candidate_topk_blocks, spec.candidate_block_size,
                                        block_scratch.data(), out.candidates.row(t));
        }
        indexer_detail::topk_row(s, n, reach_t, k, /*offset=*/0, out.topk.row(t));
      }
    };
    if (integer) {
      indexer_detail::integer_path_rows(q, keys, encoded, weights, reach, spec.pool, rows, count);
    } else {
      indexer_detail::double_path_rows(q, transposed, weights, reach, spec.pool, rows, count);
    }
  }
  if (tally != nullptr) *tally = count;
  return out;
}

}  // namespace dsv41::reference
