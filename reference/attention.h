// reference/attention.h
//
// The sparse-attention core of DeepSeek-V4.1-Flash as the official code computes it (model.py
// Attention._window_kv / _compress_kv / get_window_topk_idxs, kernel.py sparse_attn through its
// CPU port kernel_cpu.py), split at the projections: the caller passes q, kv and the index rows
// after its own linear / RMSNorm / RoPE, and applies the inverse RoPE and the output projection.
//
//   sparse_attn             one KV head (K = V), online softmax over blocks of 64 indices, sink
//   window_topk_idxs_*      which window KV rows each query reads (prefill rows, decode ring)
//   concat_*                window part first, compressed part after it (offset = window rows)
//   CompressedKvCache       the shared compressed KV cache of a kv-source layer, stored PACKED
//                           (FP4 E2M1 + E4M3 scale per 16; 288 B per entry at head_dim 512), or
//                           raw bf16 under the CachePrecision::kBf16 ablation
//
// Exactness (measured against golden/oracle, see docs/attention.md): sparse_attn is bit-exact on
// kernels.h5 and on every recorded decode row, and equal to the official CPU run on 99.998% of
// the prefill outputs, the rest 1 bf16 ulp away (not modelled: torch's SLEEF exp and vectorized
// fp32 sum order). The index rows and the cache values are exact.
//
// Example:
//   Tensor<int32_t> win = window_topk_idxs_prefill(cfg.window_size, 0, T);   // [T, min(T, W)]
//   Tensor<int32_t> idx = concat_topk_idxs(win, topk.idxs_for(owner, ratio, T));
//   Tensor<float> kv_all = concat_kv_rows(window_kv, cache.read(owner, ratio, T / ratio));
//   Tensor<float> o = sparse_attn(q, kv_all, sink, idx, softmax_scale);      // [T, H, D] bf16
#pragma once

#include <cstdint>
#include <vector>

#include "reference/cache_precision.h"
#include "reference/tensor.h"

namespace dsv41::reference {

inline constexpr int kSparseAttnBlock = 64;          // indices per online-softmax block
inline constexpr float kSparseAttnInitMax = -1e30f;  // finite start of the running max

// Sparse attention with a sink, exactly the online softmax of the official kernel:
//   q: [T, H, D] bf16, kv: [N, D] bf16 (K = V), sink: [H] fp32, idxs: [T, K] int32 (-1 = none,
//   else a row of kv), softmax_scale: fp32 -> [T, H, D] bf16.
// Per (t, h), running max m = -1e30, denominator l = 0, acc[D] = 0 (all fp32); for each block of
// 64 indices (the last may be shorter):
//   s_j = fl32(dot(q, kv_j) * scale), s_j = -inf for index -1; dot = fp32 FMA chain in d order
//   m' = max(m, max_j s_j); r = exp(m - m'); p_j = exp(s_j - m')               (fp32, std::exp)
//   l = l * r + sum_j p_j         (sum_j: double accumulation in j order, rounded once to fp32)
//   acc[d] = acc[d] * r + sum_j bf16(p_j) * kv_j[d]   (probabilities ROUNDED TO BF16; the sum is
//                                                      an fp32 FMA chain in j order)
// then l += exp(sink[h] - m) (the sink enters the denominator only, unscaled) and
// out = bf16(acc / l). A row whose indices are all -1 gives 0 (l = exp(sink + 1e30) = inf).
// An index outside [-1, N) is an error.
Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& kv,
                          const std::vector<float>& sink, const Tensor<int32_t>& idxs,
                          float softmax_scale);

// Window index rows of a prefill chunk: queries at positions start_pos .. start_pos + seqlen - 1,
// each reading positions max(0, p - W + 1) .. p, the current token included. Row width is
// min(start_pos + seqlen, W); entry j of query p holds position max(0, p - W + 1) + j, written as
// the row of a KV tensor whose row 0 holds position kv_first_pos (i.e. position - kv_first_pos),
// and -1 where that position is beyond p. The official code has start_pos = kv_first_pos = 0
// (kv = the chunk's own window KV), giving its get_window_topk_idxs rows exactly. kv_first_pos must
// not exceed the first position any row needs. -> [seqlen, width] int32.
Tensor<int32_t> window_topk_idxs_prefill(int window, int64_t start_pos, int64_t seqlen,
                                         int64_t kv_first_pos = 0);

// Window index row of a one-token decode step at position pos, over the W-slot ring buffer
// (slot = position % W), oldest slot first: slots pos%W+1 .. W-1, then 0 .. pos%W; a slot whose
// index exceeds pos (ring still filling) is -1. -> [1, W] int32.
Tensor<int32_t> window_topk_idxs_decode(int window, int64_t pos);

// The sparse_attn index rows: the window part, then the compressed part, whose entries already
// carry the offset (= rows of the window KV part) or are -1.
// window: [T, Kw] int32, compressed: [T, Kc] int32 -> [T, Kw + Kc] int32.
Tensor<int32_t> concat_topk_idxs(const Tensor<int32_t>& window, const Tensor<int32_t>& compressed);

// The sparse_attn KV rows: window KV (FP8 QDQ, bf16) then compressed KV (FP4 QDQ, bf16).
// window: [Nw, D], compressed: [Nc, D] -> [Nw + Nc, D] (values copied, no rounding).
Tensor<float> concat_kv_rows(const Tensor<float>& window, const Tensor<float>& compressed);

// The compressed-KV quantize-dequantize: FP4 E2M1 with an E4M3 scale per 16 channels
// (formats::quantize_main_kv_block), applied to the post-RoPE latent.
// x: [..., D] bf16 with D % 16 == 0 -> same shape, bf16 values (exact). NaN/Inf is an error.
Tensor<float> fp4_qdq_main_kv(const Tensor<float>& x);

// The compressed KV cache of one kv-source layer (the official compress_kv_cache, which holds
// bf16 QDQ values): entry e = the latent of compressed position position_offset + e (the group
// of tokens [(position_offset + e) * ratio, ... + ratio)), after RoPE at that group's first token
// and FP4 QDQ. dsv41 stores the packed bytes (formats::pack_main_kv layout, head_dim/2 + head_dim/16
// bytes per entry); read() returns exactly the official cache values.
// Ownership is explicit: a consumer (a Reuse layer, or the owner itself) names the owner layer
// and ratio it expects, and a mismatch is a dsv41::Error.
// With CachePrecision::kBf16 (the ablation, reference/cache_precision.h) write() skips the QDQ and
// stores the rows' bf16 bit patterns (2 * head_dim bytes per entry); read() returns them as written.
class CompressedKvCache {
 public:
  CompressedKvCache(int owner_layer, int ratio, int64_t head_dim, int64_t capacity,
                    int64_t position_offset = 0, CachePrecision precision = CachePrecision::kPacked);

  int owner_layer() const { return owner_layer_; }
  int ratio() const { return ratio_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t capacity() const { return capacity_; }
  int64_t position_offset() const { return position_offset_; }
  int64_t size() const { return size_; }  // entries written: [0, size) are valid
  int64_t entry_bytes() const { return entry_bytes_; }
  CachePrecision precision() const { return precision_; }
  formats::CacheFormat format() const { return format_; }  // kMainKvFp4, or kBf16 (ablation)

  // Quantizes (kPacked; kBf16: stores as is) and stores rows as entries
  // first_entry .. first_entry + n - 1.
  // roped_latent: [n, head_dim] bf16 (post-RoPE, pre-QDQ). first_entry <= size() (appends, or
  // rewrites a tail: entries after the written range are dropped); fits in capacity.
  void write(int64_t first_entry, const Tensor<float>& roped_latent);

  // The stored bytes of entry e (< size()): packed, or bf16 (kBf16).
  const uint8_t* entry(int64_t e) const;

  // Replaces the contents with `count` stored entries (bytes: [count, entry_bytes()], e.g. from
  // a saved session), after checking each one: every scale byte must be one the quantizer
  // writes (E4M3 in [main_kv_scale(0), main_kv_scale(FLT_MAX)], so never zero, negative or
  // NaN), else a dsv41::Error naming the entry and block; kBf16 entries must hold no NaN/Inf.
  // count <= capacity.
  void restore(const uint8_t* bytes, int64_t count);

  // Entries [0, count) dequantized (kBf16: as written), for a consumer that expects this owner
  // and ratio.
  // -> [count, head_dim] bf16 values. count <= size().
  Tensor<float> read(int expected_owner, int expected_ratio, int64_t count) const;

 private:
  int owner_layer_;
  int ratio_;
  int64_t head_dim_;
  int64_t capacity_;
  int64_t position_offset_;
  CachePrecision precision_;
  formats::CacheFormat format_;
  int64_t entry_bytes_;
  int64_t size_ = 0;
  std::vector<uint8_t> bytes_;  // [capacity, entry_bytes]
};

}  // namespace dsv41::reference
