// reference/attention_layer.h
//
// One attention sublayer of the backbone (the official Attention.forward), assembled from the
// components: linear (reference/linear.h), RMSNorm, RoPE, the SWA ring, the compressor, the
// indexer and sparse_attn. Runs any chunk of T tokens at any start position (docs/sessions.md):
// the official prefill (start 0) and one-token decode are special cases with the same bits.
//
//   qr = q_norm(wq_a(x)); q = wq_b(qr) as [T, H, D], RoPE on the last rd at the query positions
//   kv = kv_norm(wkv(x)), RoPE, FP8 QDQ (block 32, ue8m0); window KV = the ring's last
//     min(start, W-1) positions then the chunk's rows; the ring then keeps the last W positions;
//     index rows canonical: positions ascending, -1 padded to width W
//   ratio > 0: kv source -> compressor latent; index source -> indexer top-k (published with owner,
//     ratio and offset); latent -> RoPE at j*ratio -> FP4 QDQ (E4M3/16) into the owner's cache;
//     kv = [window | owner's compressed cache], indices = [window | top-k + offset, -1 padded to
//     index_topk]
//   o = sparse_attn(q, kv, sink, indices, D^-0.5); inverse RoPE on o's tail; grouped wo_a (bf16,
//     per group einsum) then wo_b (fp8) -> [T, dim] bf16
// With a CachePrecision::kBf16 state (the precision ablation, reference/cache_precision.h) every
// FP8 / FP4 QDQ above (window KV, index queries, index keys, compressed KV) is skipped and the
// caches store bf16; everything else is unchanged.
// Hooks: "index_scores" [T, N] (N = end_pos / ratio, -inf where unreachable or masked by the
// candidates) just before an index layer's top-k, when N > 0; "candidates", "topk".
#pragma once

#include <cstdint>
#include <optional>

#include "reference/config.h"
#include "reference/hooks.h"
#include "reference/indexer.h"
#include "reference/rope.h"
#include "reference/tensor.h"
#include "reference/weights.h"

namespace dsv41::reference {

struct LayerState;
struct ModelState;

// What attention layers hand down the stack (the official SharedAttentionRuntime), each object
// with its owner: the last published top-k and the candidate mask of this forward call.
struct SharedAttention {
  std::optional<PublishedTopk> topk;
  std::optional<CandidateMask> candidates;
};

// How a step may depart from the plain forward (docs/sessions.md, bounded replay).
struct AttentionStepMode {
  // Window rows never read positions below this (bounded replay truncates windows at the replay
  // start); the SWA ring need not hold positions below it.
  int64_t window_floor = 0;
  // Encoder replay: the global state (compressed KV, index keys, compressor partial group) already
  // covers this step's positions; only the local state (the SWA ring) is recomputed: no
  // compressor step and no cache writes. The indexer still selects for the step's queries.
  bool local_only = false;
};

struct AttentionRecord {
  std::optional<Tensor<int32_t>> topk;        // this layer's own indexer: [T, k], no offset
  std::optional<Tensor<uint8_t>> candidates;  // candidate source: [T, N], positions < reach only
};

// x: [T, dim] bf16 (attn_norm output) -> [T, dim] bf16. `state` holds every layer's state (a layer
// reads its kv owner's caches).
Tensor<float> attention_sublayer(const Tensor<float>& x, int64_t start_pos, const ModelConfig& c,
                                 const LayerInfo& info, const AttentionWeights& w,
                                 const RopeTable& rope, ModelState& state, SharedAttention& shared,
                                 AttentionRecord& record, const ForwardHooks* hooks = nullptr,
                                 const AttentionStepMode& mode = {});

}  // namespace dsv41::reference
