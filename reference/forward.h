// reference/forward.h
//
// Internal to the model (reference/model.cc): what one forward step carries between its layers,
// the hook observer, and the attention sublayer's orchestration (reference/forward_attention.cc).
// Everything here reaches components only through Ops (reference/ops.h).
//
// The attention sublayer of layer L (official Attention.forward), x: [T, dim] bf16 (attn_norm
// output) -> [T, dim] bf16:
//   qr = q_norm(wq_a(x)); q = wq_b(qr) -> RoPE on each head's tail at the query positions
//   window KV = kv_norm(wkv(x)) -> RoPE -> the window_kv format's QDQ; the rows this step reads are
//     the ring's last min(start - floor, W - 1) positions, then the step's own rows; the ring then
//     keeps the last W positions; index rows canonical (attention.h window_index_rows)
//   ratio > 0: kv source -> compressor latent (ratio 2: fp32 projections pooled; ratio 1: bf16
//     wkv) -> compressor.norm; index source -> indexer scores against the owner's index_keys
//     (its own new keys first: k_norm(wk(latent)) -> RoPE at j * ratio -> index_keys), candidate
//     blocks (the candidate source) or the candidate mask (later index layers), top-k (published
//     with its owner; Reuse layers take it); the latent -> RoPE at j * ratio -> compressed_kv;
//     sparse_attn over [window rows | the owner's compressed_kv], rows = window rows + top-k
//     shifted by the window rows and padded to index_topk
//   o = sparse_attn(q, ..., sink, D^-0.5); inverse RoPE on o's tails; wo_b(grouped wo_a(o))
// Hooks: "candidates", "index_scores" (just before the top-k, when N > 0), "topk".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "reference/config.h"
#include "reference/hooks.h"
#include "reference/indexer.h"
#include "reference/kv_cache.h"
#include "reference/ops.h"
#include "reference/rope.h"
#include "reference/weights.h"

namespace dsv41::reference {

// Shows values to the hooks and takes their replacements. A device backend's tensor is
// downloaded for the hook and the result uploaded back; without a hook nothing moves.
class Observer {
 public:
  Observer(const Ops& ops, const ForwardHooks& hooks) : ops_(ops), hooks_(hooks) {}
  const ForwardHooks& hooks() const { return hooks_; }

  template <typename T>
  void operator()(Component what, int layer, Tensor<T>& v) const {
    if (!hooked(v) || hooks_.skips(what)) return;
    if (v.on_host()) {
      hooks_.on(what, layer, v);
      return;
    }
    Tensor<T> host = ops_.download(v);  // a copy: v stays where it is
    hooks_.on(what, layer, host);
    if (!hooks_.read_only) v = ops_.upload(std::move(host));
  }

 private:
  bool hooked(const Tensor<float>&) const { return static_cast<bool>(hooks_.tensor); }
  bool hooked(const Tensor<int32_t>&) const { return static_cast<bool>(hooks_.index); }
  bool hooked(const Tensor<uint8_t>&) const { return static_cast<bool>(hooks_.mask); }

  const Ops& ops_;
  const ForwardHooks& hooks_;
};

// What attention layers hand down the stack in one step (the official SharedAttentionRuntime),
// each object with its owner: the last published top-k (compressed positions, no offset: each
// consumer adds its own window rows) and the candidate mask.
struct SharedAttention {
  std::optional<PublishedTopk> topk;
  std::optional<CandidateMask> candidates;
};

// How a step may depart from the plain forward (docs/sessions.md, bounded replay).
struct AttentionStepMode {
  // Window rows never read positions below this (bounded replay truncates windows at the replay
  // start); the window_kv ring need not hold positions below it.
  int64_t window_floor = 0;
  // Encoder replay: the global state (compressed_kv, index_keys, the compressor's partial group)
  // already covers this step's positions; only the window_kv ring is recomputed: no compressor
  // step and no cache writes. The indexer still selects for the step's queries.
  bool local_only = false;
};

// What a step records of its selections, as the ops hold them (downloaded when the step ends).
struct StepSelections {
  std::map<int, Tensor<int32_t>> topk;        // index-source layer -> [T, k], no offset
  std::map<int, Tensor<uint8_t>> candidates;  // candidate source -> [T, N]
  std::map<int, std::vector<int64_t>> reach;  // candidate source -> [T] reach of each row
  std::map<int, Tensor<int64_t>> engram_ids;  // engram layer -> [T, cols]
  std::map<int, Tensor<int32_t>> experts;     // layer -> [T, k]
};

// The attention sublayer of `info.layer` (above). x: [T, dim] bf16 -> [T, dim] bf16. `state` holds
// every layer's state (a layer reads its kv owner's caches).
Tensor<float> attention_sublayer(const Ops& ops, const Tensor<float>& x, int64_t start_pos, const ModelConfig& c,
                                 const LayerInfo& info, const AttentionWeights& w, const RopeTable& rope,
                                 ModelState& state, SharedAttention& shared, StepSelections& record,
                                 const Observer& observe, const AttentionStepMode& mode);

}  // namespace dsv41::reference
