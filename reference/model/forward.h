// reference/model/forward.h
//
// Internal to the model (reference/model/model.cc, model_dspark.cc): what one forward step carries
// between its layers (StepContext), the hook observer, the block written once (block_forward,
// reference/model/block.cc) and the attention sublayer's orchestration (forward_attention.cc).
// Everything here reaches components only through Ops (reference/seam/ops.h).
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
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "reference/ops/config.h"
#include "reference/model/hooks.h"
#include "reference/ops/indexer.h"
#include "reference/model/kv_cache.h"
#include "reference/seam/ops.h"
#include "reference/ops/rope.h"
#include "reference/checkpoint/weights.h"

namespace dsv41::reference::model {

// Shows values to the hooks and takes their replacements. A device backend's tensor is
// downloaded for the hook and the result uploaded back; without a hook nothing moves.
class Observer {
 public:
  Observer(const seam::Ops& ops, const ForwardHooks& hooks) : ops_(ops), hooks_(hooks) {}
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

  const seam::Ops& ops_;
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

// What every block of a step shares: the ops, the config, and the observer (the hooks).
struct BlockContext {
  const seam::Ops& ops;
  const ModelConfig& config;
  const Observer& observe;
};

// What one forward step carries through its layers (Model::forward_chunk builds it once): the
// model's weights and RoPE tables, the state every layer reads and writes, what attention layers
// hand down, what the step records, and how the step departs from the plain forward (the loop
// raises mode.window_floor after a decoder-replay cut).
struct StepContext : BlockContext {
  const checkpoint::ModelWeights& weights;
  const std::vector<RopeTable>& rope;  // [total_layers]
  ModelState& state;
  SharedAttention& shared;
  StepSelections& record;
  AttentionStepMode mode;
};

// The attention sublayer of `info.layer` (above). x: [T, dim] bf16 (attn_norm output) at
// positions start_pos .. start_pos + T - 1 -> [T, dim] bf16. The step's state holds every layer's
// state (a layer reads its kv owner's caches).
Tensor<float> attention_sublayer(const StepContext& step, const LayerInfo& info, const Tensor<float>& x,
                                 int64_t start_pos);

// The observable values of one block, by name: a backbone block's or a DSpark block's.
struct BlockComponents {
  Component hc_attn_pre, hc_attn_post, hc_attn_comb, attn_in, attn_out, attn_stream;
  Component hc_ffn_pre, hc_ffn_post, hc_ffn_comb, ffn_in, experts, ffn_out, out_stream;
};
extern const BlockComponents kBackboneBlock;
extern const BlockComponents kDSparkBlock;

// The attention a block runs: x [T, dim] bf16 (attn_norm output) -> [T, dim] bf16.
using BlockAttention = std::function<Tensor<float>(const Tensor<float>& x)>;

// One block after its input (official Block.forward), written once for the backbone and the
// DSpark blocks (reference/model/block.cc):
//   attention sublayer: mixes from the stream; x = attn_norm(hc_pre(stream, pre));
//                       stream = hc_post(attention(x), stream, post, comb)
//   FFN sublayer:       mixes from the stream; x = ffn_norm(hc_pre(stream, attention's pre));
//                       stream = hc_post(moe_experts(x, moe_gate(x)), stream, post, comb)
// stream: [T, hc, dim] bf16, in and out; pre: [T, hc] fp32, the pre this block applies, on return
// the FFN's pre (the next block's, or the head's). Returns the routed experts [T, k] int32.
Tensor<int32_t> block_forward(const BlockContext& ctx, const BlockComponents& names, int layer, const checkpoint::BlockWeights& bw,
                              const BlockAttention& attention, Tensor<float>& stream, Tensor<float>& pre);

}  // namespace dsv41::reference::model
