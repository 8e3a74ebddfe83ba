// reference/ops/compressor.h
//
// The KV compressor of a kv-source layer (model.py Compressor), split at its projections: the
// caller computes kv = wkv(x) and score = wgate(x) from the attention input promoted to fp32
// (F.linear with the fp32 compressor weights), and applies compressor.norm (RMSNorm) to what
// compress() returns. RoPE at the group's first token and the FP4 QDQ into the compressed cache
// come after the indexer has used the latent (reference/ops/attention.h CompressedKvCache).
//
// ratio >= 2 (released: 2): tokens are pooled in non-overlapping groups [r*j, r*j + r). Per
// channel c, a softmax over the group's r scores weighs the r kv rows:
//   m = max_t s_t[c]; e_t = exp(s_t[c] - m); z = e_0 + ... + e_{r-1}; w_t = e_t / z
//   latent_j[c] = bf16(kv_0[c]*w_0 + ... + kv_{r-1}[c]*w_{r-1})
// Everything is fp32 (std::exp; sums left to right; each product rounded before the sum), as
// torch's softmax(dim) and (kv * w).sum(dim) compute it on the CPU; the only bf16 rounding is the
// latent's (kv.to(bf16) before the norm). The division is a true division (the oracle cannot tell
// it from a multiplication by 1/z; both match it bit for bit).
//
// ratio 1 (released layer 20) has no pooling, no gate and no fp32 promotion: the caller's latent
// is compressor.norm(wkv(x)) with bf16 weights; compress() rejects ratio 1.
//
// The partial trailing group waits in the state tensors (the official kv_state / score_state
// buffers, fp32, slot = position % ratio, score -inf = never written). A group is pooled as soon
// as its last token arrives. To give the official state bytes on the official paths, a group that
// lies entirely inside one call is pooled from the inputs without touching the state (the
// official prefill), while a token of a group that began in an earlier call, or of the trailing
// partial group, is written to its slot first (the official decode step writes the slot, then
// pools from the state). Slots outside the pending group are stale and carry no meaning.
//
// Exactness: bit-exact against golden/oracle (prefill latents and state, decode steps 0..7),
// given kv/score equal to the official fp32 projections.
//
// Example:
//   Tensor<float> kv_state({2, head_dim}, "kv_state"), score_state({2, head_dim}, "score_state", -inf);
//   CompressedLatents c = compress(kv, score, 0, 2, kv_state, score_state);  // prefill: T/2 latents
//   // decode: compress(kv1, score1, pos, 2, ...) returns 1 latent when (pos + 1) % 2 == 0, else 0
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::reference {

struct CompressedLatents {
  int64_t first_group = 0;  // compressed position (group index) of row 0
  Tensor<float> latent;     // [n, dim] bf16: pooled, BEFORE compressor.norm, RoPE and QDQ

  int64_t count() const { return latent.rank() == 2 ? latent.dim(0) : 0; }
};

// Pools the groups completed by tokens start_pos .. start_pos + T - 1 and keeps the trailing
// partial group in the state tensors (the model's CompressorState, reference/model/kv_cache.h, holds
// them and checks that tokens arrive in order).
// kv, score: [T, dim] fp32 (wkv(x.float()), wgate(x.float())); kv_state, score_state:
// [ratio, dim] fp32, slot = position % ratio, in/out. -> the completed latents, in group order
// (possibly 0); first_group = start_pos / ratio.
CompressedLatents compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos, int ratio,
                           Tensor<float>& kv_state, Tensor<float>& score_state);

// One group's pooling (the formula above, without the bf16 rounding):
// kv_rows[t], score_rows[t]: [dim] fp32 for t in [0, ratio) -> out: [dim] fp32.
void pool_group(const float* const* kv_rows, const float* const* score_rows, int ratio,
                int64_t dim, float* out);

}  // namespace dsv41::reference
