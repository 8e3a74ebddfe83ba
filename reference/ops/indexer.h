// reference/ops/indexer.h
//
// The CSA2 indexer of DeepSeek-V4.1-Flash (model.py Indexer.forward, select_candidate_blocks),
// split at its projections, plus the explicitly owned objects that index sources hand to later
// layers. The caller computes (linear, RMSNorm and RoPE are not here):
//   keys (kv sources): k = k_norm(wk(latent)) on the post-norm, pre-RoPE bf16 latent, RoPE on the
//                      last rope_head_dim channels at position j * ratio; then the index_keys
//                      cache's FP4 QDQ (qdq(kIndexKeysFp4, k), reference/ops/kv_quant.h)
//   query:             q = wq_b(qr) as [T, Hi, Di], RoPE at the query positions; the same QDQ
//   weights_proj:      proj = weights_proj(x) [T, Hi] bf16; index_weights (here) scales it
// (The CachePrecision::kBf16 ablation skips both QDQ steps and keeps bf16 index keys.)
//
// Scores (every step a bf16 tensor, as in the official code; bit-exact against the oracle):
//   dot[t,h,n]   = bf16(q[t,h] . k[n])          exact sum in double, rounded once to fp32, then bf16
//   term[t,h,n]  = bf16(relu(dot) * w[t,h])     fp32 product, rounded to bf16
//   score[t,n]   = bf16(term[t,0,n] + ... + term[t,Hi-1,n])   fp32 sum in head order, ONE bf16
//                  rounding at the end (torch sums a bf16 tensor in fp32; a bf16 rounding per
//                  step matches the oracle on only ~70% of the scores)
//   score[t,n]   = -inf where n >= reach[t]
// reach (the number of compressed positions query position p may read) = (p + 1) / ratio: a group
// is visible once its last token has passed. In decode this is end_pos / ratio.
//
// Top-k (the dsv41 tie rule of reference/ops/topk.h: among equal scores the LOWER position wins):
//   k = min(index_topk, N) with N = end_pos / ratio columns; the k best positions are sorted
//   ascending; a position >= reach[t] becomes -1, the others get + offset (offset = the number of
//   window KV rows in front of the compressed rows: seqlen in prefill, window_size in decode).
// Candidate blocks (the candidate source only; then it still runs its own top-k over all reachable
// positions): pad the row with -inf to a multiple of block_size; block score = max of its
// positions; the block holding the newest reachable position, (reach - 1) / block_size (none when
// reach is 0), is pinned to +inf; the min(topk_blocks, nblocks) best blocks (same tie rule) whose
// score is > -inf are kept and expanded to a position mask. An index layer after the candidate
// source sets score = -inf outside that mask before its top-k.
//
// Example (a Full layer, prefill of T tokens at start 0, ratio r):
//   std::vector<int64_t> reach = compressed_reach(0, T, r);
//   Tensor<float> s = index_scores(qdq(CacheFormat::kIndexKeysFp4, q), keys,   // keys: [T/r, Di]
//                                  index_weights(proj, cfg.index_head_dim), reach);
//   PublishedTopk top = select_index_topk(s, reach, cfg.index_topk, T, layer, r);
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::reference {

// fl32(Di^-0.5 * Hi^-0.5): the factor of weights_proj (computed in double, as Python does, then
// rounded to fp32 as torch does for a scalar multiplying a bf16 tensor).
float index_weight_scale(int index_head_dim, int index_n_heads);

// w = bf16(proj * index_weight_scale(Di, Hi)). proj: [T, Hi] bf16 -> [T, Hi] bf16.
Tensor<float> index_weights(const Tensor<float>& proj, int index_head_dim);

// reach[t] = (start_pos + t + 1) / ratio for t in [0, seqlen). Non-decreasing.
std::vector<int64_t> compressed_reach(int64_t start_pos, int64_t seqlen, int ratio);

// How index_scores computes its dots. Both paths give the same bits (reference/ops/indexer_fast.cc
// proves it); the choice only changes the speed.
enum class IndexScoresPath {
  kInteger,  // exact integer dots for the (query, key) pairs whose rows encode as small integer codes
             // times a power of two (every FP4-QDQ row of realistic scales), the double path for the rest
  kDouble,   // every dot a double sum in index order (indexer.cc's scores16): the readable specification
};

// What one call did, in groups of 16 keys of one query (tests: that the integer path really ran).
struct IndexScoresTally {
  int64_t integer_groups = 0;
  int64_t double_groups = 0;
};

// The index scores above. q: [T, Hi, Di] QDQ bf16, keys: [N, Di] QDQ bf16, weights: [T, Hi]
// bf16, reach: [T] with reach[t] <= N -> [T, N] bf16 (-inf where unreachable).
Tensor<float> index_scores(const Tensor<float>& q, const Tensor<float>& keys,
                           const Tensor<float>& weights, const std::vector<int64_t>& reach,
                           IndexScoresPath path = IndexScoresPath::kInteger, IndexScoresTally* tally = nullptr);

// The same scores where pool [T, N] uint8 is set, -inf elsewhere: bit for bit index_scores then
// apply_score_mask(pool), but a group of 16 keys with no pool byte set in a row is not scored (a
// layer inside the candidate pool scores at most topk_blocks x block_size keys per query).
Tensor<float> index_scores_in_pool(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                                   const std::vector<int64_t>& reach, const Tensor<uint8_t>& pool,
                                   IndexScoresPath path = IndexScoresPath::kInteger,
                                   IndexScoresTally* tally = nullptr);

// ---- what an index source publishes, with explicit ownership ----

// The compressed-position top-k of an index source (the official shared_attn.topk_idxs), which
// its Reuse layers take unchanged. idxs: [T, k] int32, ascending positions + offset, or -1.
struct PublishedTopk {
  int owner_layer = -1;
  int ratio = 0;
  int64_t offset = 0;
  Tensor<int32_t> idxs;

  // idxs, for a consumer that expects this owner, ratio and offset; a mismatch is an error.
  const Tensor<int32_t>& idxs_for(int expected_owner, int expected_ratio,
                                  int64_t expected_offset) const;
};

// The candidate mask published by the candidate source (the official shared_attn.candidates).
// mask: [T, N] uint8, 1 = the position lies in a kept block.
struct CandidateMask {
  int owner_layer = -1;
  Tensor<uint8_t> mask;

  // mask, for a consumer that expects this owner; a mismatch is an error.
  const Tensor<uint8_t>& mask_for(int expected_owner) const;
};

// ---- the fused indexer (Ops::index_select) ----

// What one index layer's selection needs besides its scores' inputs.
//   candidate source: topk_blocks > 0 and block_size > 0; the op also returns its mask
//   a layer inside the candidate pool: pool = the source's mask [T, N] (scores -inf outside it)
//   any other index layer: neither
struct IndexSelectSpec {
  int index_topk = 0;
  int candidate_topk_blocks = 0;         // > 0: this layer is the candidate source
  int candidate_block_size = 0;
  const Tensor<uint8_t>* pool = nullptr;  // non-null: score only inside this candidate mask
};

// Its outputs, as the unfused ops give them.
struct IndexSelection {
  Tensor<int32_t> topk;        // [T, min(index_topk, N)]: index_topk(...)
  Tensor<uint8_t> candidates;  // the candidate source: [T, N] candidate_blocks(...); else rank 0
};

// Ops::index_select's composition (index_scores, then candidate_blocks for the candidate source or
// the pool's mask for a layer inside it, then index_topk) with the same outputs bit for bit, without
// the [T, N] score tensor: every query row's scores, block maxima, pool and top-k depend on that row
// alone, so the rows are scored in tiles of `rows_per_tile` (0: at least 8 per thread, at most
// 256 MiB of scores) into one reused buffer, and each worker selects from the rows it just scored.
// keys [N, Di] as index_scores takes them (the cache rows dequantized), pool (spec.pool) [T, N].
// The reference backend's index_select (the sampled replay of a 2^20-key step: 16 GiB of scores per
// index layer otherwise, most of its time the first touch of fresh pages).
IndexSelection index_select_by_rows(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                                    const std::vector<int64_t>& reach, const IndexSelectSpec& spec,
                                    IndexScoresPath path = IndexScoresPath::kInteger, int64_t rows_per_tile = 0,
                                    IndexScoresTally* tally = nullptr);

// ---- selection ----

// Sets scores[t, n] = -inf where the candidate mask is 0 (a layer after the candidate source).
// scores: [T, N] bf16, in place; the mask must have the same shape and the expected owner.
void apply_candidate_mask(Tensor<float>& scores, const CandidateMask& candidates,
                          int expected_owner);

// The same with the mask as it is (Ops::mask_scores: no owner to check, no copy of a [T, N] mask);
// owner_layer only names it in the error of a shape mismatch.
void apply_score_mask(Tensor<float>& scores, const Tensor<uint8_t>& mask, int owner_layer = -1);

// Block scores that enter the candidate top-k: [T, ceil(N / block_size)] (max of each block's
// scores, -inf padding, newest reachable block pinned to +inf). scores: [T, N] bf16.
Tensor<float> candidate_block_scores(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                     int block_size);

// The candidate source's mask (see above). scores: [T, N] bf16 (already -inf where unreachable).
CandidateMask select_candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                      int topk_blocks, int block_size, int owner_layer);

// The position top-k (see above). scores: [T, N] bf16 with N = end_pos / ratio = reach.back().
// -> [T, min(index_topk, N)] int32 owned by owner_layer.
PublishedTopk select_index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                int index_topk, int64_t offset, int owner_layer, int ratio);

}  // namespace dsv41::reference
