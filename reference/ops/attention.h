// reference/ops/attention.h
//
// The sparse-attention core of DeepSeek-V4.1-Flash as the official code computes it (model.py
// Attention._window_kv / _compress_kv / get_window_topk_idxs, kernel.py sparse_attn through its
// CPU port kernel_cpu.py), split at the projections: the caller passes q, kv and the index rows
// after its own linear / RMSNorm / RoPE, and applies the inverse RoPE and the output projection.
//
//   sparse_attn             one KV head (K = V), online softmax over blocks of 64 indices, sink
//   window_topk_idxs_*      which window KV rows each query reads (prefill rows, decode ring)
//   concat_*                window part first, compressed part after it (offset = window rows)
//   window_index_rows       the canonical (chunking-independent) window rows of any step
//   attention_index_rows    window rows + the compressed top-k, offset and padded
// The caches themselves are reference/model/kv_cache.h (model state); their formats reference/ops/kv_quant.h.
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

#include "reference/ops/tensor.h"

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

// The online softmax of one (q, h) row of sparse_attn above, block by block: m the running max,
// l the running denominator (fp32). Shared with device backends that keep the exp steps on the
// host (std::exp is glibc's: cuda/cuda_ops_mhc_attn.cc).
struct OnlineSoftmax {
  float m = kSparseAttnInitMax;
  float l = 0.0f;
  // One block: s [nb] scaled scores (-inf for index -1), nb <= kSparseAttnBlock. Writes
  // p_bf16[j] = bf16(exp(s_j - m')), updates l and m; returns r = exp(m - m'), the factor of the
  // numerator acc.
  float block(const float* s, int64_t nb, float* p_bf16);
  // The final denominator: l + exp(sink - m).
  float finish(float sink) const;
};

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

// Canonical window index rows (docs/sessions.md): query p = start_pos + t reads positions
// max(floor, p - W + 1) .. p in ascending order, written as rows of a KV tensor whose row 0 holds
// position kv_first_pos, and -1 pads the row to width W. A row depends on p (and the floor) alone,
// never on how the tokens were chunked; the official prefill (width min(T, W)) and decode (-1
// slots first) read the same rows in the same order. -> [T, W] int32.
Tensor<int32_t> window_index_rows(int window, int64_t start_pos, int64_t seqlen, int64_t kv_first_pos,
                                  int64_t floor);

// The sparse_attn index rows of a compressed layer: the window rows, then the compressed top-k
// (compressed positions, -1 padding) shifted by `offset` (= the window KV rows in front of the
// compressed rows) and padded with -1 to `width` (index_topk: the canonical width).
// window: [T, Kw] int32, topk: [T, k <= width] int32 -> [T, Kw + width] int32.
Tensor<int32_t> attention_index_rows(const Tensor<int32_t>& window, const Tensor<int32_t>& topk, int64_t offset,
                                     int64_t width);

}  // namespace dsv41::reference
