// reference/indexer.h
//
// The CSA2 indexer of DeepSeek-V4.1-Flash (model.py Indexer.forward, select_candidate_blocks),
// split at its projections, plus the explicitly owned objects that index sources hand to later
// layers. The caller computes (linear, RMSNorm and RoPE are not here):
//   keys (kv sources): k = k_norm(wk(latent)) on the post-norm, pre-RoPE bf16 latent, RoPE on the
//                      last rope_head_dim channels at position j * ratio; then fp4_qdq_index (here)
//   query:             q = wq_b(qr) as [T, Hi, Di], RoPE at the query positions; fp4_qdq_index
//   weights_proj:      proj = weights_proj(x) [T, Hi] bf16; index_weights (here) scales it
// (The CachePrecision::kBf16 ablation skips both fp4_qdq_index steps and keeps bf16 index keys.)
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
// Top-k (the dsv41 tie rule of reference/topk.h: among equal scores the LOWER position wins):
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
//   Tensor<float> s = index_scores(fp4_qdq_index(q), keys.read(layer, r, T / r),
//                                  index_weights(proj, cfg.index_head_dim), reach);
//   PublishedTopk top = select_index_topk(s, reach, cfg.index_topk, T, layer, r);
#pragma once

#include <cstdint>
#include <vector>

#include "reference/cache_precision.h"
#include "reference/tensor.h"

namespace dsv41::reference {

// FP4 E2M1 with an E8M0 (ceil) scale per 32 channels, quantized and dequantized
// (formats::quantize_index_block): the indexer's keys and queries.
// x: [..., Di] bf16 with Di % 32 == 0 -> same shape, bf16 values (exact). NaN/Inf is an error.
Tensor<float> fp4_qdq_index(const Tensor<float>& x);

// fl32(Di^-0.5 * Hi^-0.5): the factor of weights_proj (computed in double, as Python does, then
// rounded to fp32 as torch does for a scalar multiplying a bf16 tensor).
float index_weight_scale(int index_head_dim, int index_n_heads);

// w = bf16(proj * index_weight_scale(Di, Hi)). proj: [T, Hi] bf16 -> [T, Hi] bf16.
Tensor<float> index_weights(const Tensor<float>& proj, int index_head_dim);

// reach[t] = (start_pos + t + 1) / ratio for t in [0, seqlen). Non-decreasing.
std::vector<int64_t> compressed_reach(int64_t start_pos, int64_t seqlen, int ratio);

// The index scores above. q: [T, Hi, Di] QDQ bf16, keys: [N, Di] QDQ bf16, weights: [T, Hi]
// bf16, reach: [T] with reach[t] <= N -> [T, N] bf16 (-inf where unreachable).
Tensor<float> index_scores(const Tensor<float>& q, const Tensor<float>& keys,
                           const Tensor<float>& weights, const std::vector<int64_t>& reach);

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

// The index-key cache of a kv-source layer (the official indexer k_cache): entry e = the key of
// compressed position position_offset + e, after RoPE at (position_offset + e) * ratio, stored
// PACKED (formats::pack_index_key: Di/2 + Di/32 bytes, 68 B at Di = 128). read() returns exactly
// the official bf16 cache values. Reindex and Reuse layers read the cache of their kv source and
// must name the owner and ratio they expect; a mismatch is a dsv41::Error.
// With CachePrecision::kBf16 (the ablation, reference/cache_precision.h) write() skips the QDQ and
// stores the keys' bf16 bit patterns (2 * Di bytes per entry); read() returns them as written.
class IndexKeyCache {
 public:
  IndexKeyCache(int owner_layer, int ratio, int64_t index_head_dim, int64_t capacity,
                int64_t position_offset = 0, CachePrecision precision = CachePrecision::kPacked);

  int owner_layer() const { return owner_layer_; }
  int ratio() const { return ratio_; }
  int64_t index_head_dim() const { return dim_; }
  int64_t capacity() const { return capacity_; }
  int64_t position_offset() const { return position_offset_; }
  int64_t size() const { return size_; }
  int64_t entry_bytes() const { return entry_bytes_; }
  CachePrecision precision() const { return precision_; }
  formats::CacheFormat format() const { return format_; }  // kIndexKeyFp4, or kBf16 (ablation)

  // Quantizes (fp4_qdq_index's format; kBf16: stores as is) and stores rows as entries
  // first_entry .. first_entry + n - 1.
  // roped_keys: [n, Di] bf16 (post-RoPE, pre-QDQ). first_entry <= size() (append, or rewrite a
  // tail; later entries are dropped); fits in capacity.
  void write(int64_t first_entry, const Tensor<float>& roped_keys);

  const uint8_t* entry(int64_t e) const;  // packed bytes of entry e < size()

  // Replaces the contents with `count` packed entries (bytes: [count, entry_bytes()], e.g. from
  // a saved session), after checking each one: every scale byte must be one the quantizer
  // writes (E8M0 in [index_scale(0), index_scale(FLT_MAX)], never the NaN code 0xFF), else a
  // dsv41::Error naming the entry and block. count <= capacity.
  void restore(const uint8_t* bytes, int64_t count);

  // Entries [0, count) as bf16 QDQ values, for a consumer expecting this owner and ratio.
  Tensor<float> read(int expected_owner, int expected_ratio, int64_t count) const;

 private:
  int owner_layer_;
  int ratio_;
  int64_t dim_;
  int64_t capacity_;
  int64_t position_offset_;
  CachePrecision precision_;
  formats::CacheFormat format_;
  int64_t entry_bytes_;
  int64_t size_ = 0;
  std::vector<uint8_t> bytes_;  // [capacity, entry_bytes]
};

// ---- selection ----

// Sets scores[t, n] = -inf where the candidate mask is 0 (a layer after the candidate source).
// scores: [T, N] bf16, in place; the mask must have the same shape and the expected owner.
void apply_candidate_mask(Tensor<float>& scores, const CandidateMask& candidates,
                          int expected_owner);

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
