// reference/model/forward_attention.cc
//
// The attention sublayer's orchestration (reference/model/forward.h states what it computes). Every
// value is computed by an op; this file decides which op runs on what, in which order, and which
// cache and which published selection each layer reads and writes.
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "reference/model/forward.h"

namespace dsv41::reference::model {
namespace {

// The compressor latents a kv source's step completes: pooled (ratio > 1) or projected (ratio 1),
// then compressor.norm. [n, D] bf16, pre-RoPE (the indexer's keys use this form).
CompressedLatents compressor_step(const seam::Ops& ops, const Tensor<float>& x, int64_t start_pos, const ModelConfig& c,
                                  const LayerInfo& info, const checkpoint::AttentionWeights& w, LayerState& ls) {
  CompressedLatents latents;
  if (info.ratio > 1) {
    const Tensor<float> kv = ops.linear_fp32(x, w.comp_wkv);       // [T, D] fp32
    const Tensor<float> score = ops.linear_fp32(x, w.comp_wgate);  // [T, D] fp32
    latents = compress(ops, *ls.compressor, kv, score, start_pos);
  } else {
    latents.first_group = start_pos;
    latents.latent = ops.linear(x, w.comp_wkv);  // bf16 weight: [T, D] bf16
  }
  if (latents.count() > 0) latents.latent = ops.rms_norm(latents.latent, w.comp_norm, c.norm_eps);
  return latents;
}

}  // namespace

Tensor<float> attention_sublayer(const StepContext& step, const LayerInfo& info, const Tensor<float>& x,
                                 int64_t start_pos) {
  const seam::Ops& ops = step.ops;
  const ModelConfig& c = step.config;
  const checkpoint::AttentionWeights& w = step.weights.blocks[static_cast<size_t>(info.layer)].attn;
  const RopeTable& rope = step.rope[static_cast<size_t>(info.layer)];
  ModelState& state = step.state;
  SharedAttention& shared = step.shared;
  StepSelections& record = step.record;
  const Observer& observe = step.observe;
  const AttentionStepMode& mode = step.mode;
  const int64_t T = x.dim(0), H = c.n_heads, D = c.head_dim;
  const int W = c.window_size, ratio = info.ratio, layer = info.layer;
  LayerState& ls = state.layers[static_cast<size_t>(layer)];

  // Queries. qr is shared with the indexer.
  const Tensor<float> qr = ops.rms_norm(ops.linear(x, w.wq_a), w.q_norm, c.norm_eps);  // [T, q_lora] bf16
  Tensor<float> q = ops.linear(qr, w.wq_b);                                              // [T, H*D] bf16
  ops.rope_rows(q, H, rope, start_pos, 1, false);

  // Window KV: RoPE then the window_kv format's QDQ of all D channels (rope tail included).
  Tensor<float> kv = ops.rms_norm(ops.linear(x, w.wkv), w.kv_norm, c.norm_eps);  // [T, D] bf16
  ops.rope_rows(kv, 1, rope, start_pos, 1, false);
  kv = ops.qdq(ls.window_kv.format, kv);
  // The window KV rows this step reads: the ring's last r positions before the step (the most any
  // query of it can reach back), then the step's own rows; row 0 holds position start_pos - r.
  // Read before the step overwrites ring slots.
  DSV41_CHECK(mode.window_floor >= 0 && mode.window_floor <= start_pos, "layer ", layer, ": window floor ",
              mode.window_floor, " beyond the step's start ", start_pos);
  const int64_t r = std::min<int64_t>(start_pos - mode.window_floor, W - 1);
  const Tensor<float> window_kv = ops.concat_kv_rows(ls.window_kv.read_positions(ops, start_pos - r, r), kv);
  const int64_t kept = std::min<int64_t>(T, W);  // the ring keeps the last W positions
  ls.window_kv.write(ops, start_pos + T - kept, T > W ? ops.slice_rows(kv, T - kept, kept) : kv);
  const Tensor<int32_t> window_idxs =
      ops.upload(window_index_rows(W, start_pos, T, start_pos - r, mode.window_floor));  // [T, W]
  const int64_t offset = window_kv.dim(0);  // window rows in front of the compressed rows

  Tensor<int32_t> idxs = window_idxs;
  CacheRows compressed;  // none for window-only layers
  if (ratio > 0) {
    const int64_t end_pos = start_pos + T;
    const int64_t compress_len = end_pos / ratio;
    LayerState& owner = state.layers[static_cast<size_t>(info.kv_owner)];
    // Kv source: the compressor's latents of the groups this step completes.
    CompressedLatents latents;
    if (info.role == LayerRole::kFull && !mode.local_only) latents = compressor_step(ops, x, start_pos, c, info, w, ls);
    // Indexer (index sources) or the published top-k (Reuse layers).
    if (info.role == LayerRole::kFull || info.role == LayerRole::kReindex) {
      Tensor<int32_t> own;  // [T, min(index_topk, N)] compressed positions, -1 padding
      if (compress_len == 0) {
        own = ops.upload(Tensor<int32_t>({T, 0}, "topk"));
      } else {
        if (info.role == LayerRole::kFull && latents.count() > 0) {
          Tensor<float> k = ops.rms_norm(ops.linear(latents.latent, w.idx_wk), w.idx_k_norm, c.norm_eps);
          ops.rope_rows(k, 1, rope, latents.first_group * ratio, ratio, false);
          ls.index_keys->write(ops, latents.first_group, k);
        }
        Tensor<float> qi = ops.linear(qr, w.idx_wq_b);  // [T, Hi*Di] bf16
        ops.rope_rows(qi, c.index_n_heads, rope, start_pos, 1, false);
        qi = ops.qdq(owner.index_keys->format(),
                     std::move(qi).reshaped({T, c.index_n_heads, c.index_head_dim}));  // [T, Hi, Di]
        const Tensor<float> weights = ops.index_weights(ops.linear(x, w.idx_weights_proj), c.index_head_dim);
        const std::vector<int64_t> reach = compressed_reach(start_pos, T, ratio);
        const CacheRows keys = owner.index_keys->rows(info.kv_owner, ratio, compress_len);
        const bool in_pool = info.uses_candidates && !info.candidate_source;
        if (in_pool) {
          DSV41_CHECK(shared.candidates.has_value(), "layer ", layer, ": needs the candidate mask of layer ",
                      c.candidate_source_layer, ", which has not run in this step");
        }
        const Tensor<uint8_t>* pool =
            in_pool ? &shared.candidates->mask_for(c.candidate_source_layer) : nullptr;
        // The scores are a hooked value only when a hook wants them; otherwise the whole selection
        // is one op (Ops::index_select: its default is exactly the composition below).
        const auto publish_candidates = [&] {  // the candidate source's mask: hooked and recorded
          observe(Component::kCandidates, layer, shared.candidates->mask);
          record.candidates.insert_or_assign(layer, shared.candidates->mask);
          record.reach.insert_or_assign(layer, reach);
        };
        const ForwardHooks& hooks = observe.hooks();
        if (hooks.tensor && !hooks.skips(Component::kIndexScores)) {
          Tensor<float> scores = ops.index_scores(qi, keys, weights, reach);  // [T, N] bf16
          if (info.candidate_source) {
            shared.candidates =
                CandidateMask{layer, ops.candidate_blocks(scores, reach, c.candidate_topk_blocks, c.candidate_block_size)};
            publish_candidates();
          } else if (pool != nullptr) {
            ops.mask_scores(scores, *pool);
          }
          // The scores the top-k is taken from; a replacement changes the selection (the
          // candidate source's mask was already selected above).
          observe(Component::kIndexScores, layer, scores);
          own = ops.index_topk(scores, reach, c.index_topk);
        } else {
          IndexSelectSpec spec;
          spec.index_topk = c.index_topk;
          if (info.candidate_source) {
            spec.candidate_topk_blocks = c.candidate_topk_blocks;
            spec.candidate_block_size = c.candidate_block_size;
          }
          spec.pool = pool;
          IndexSelection sel = ops.index_select(qi, keys, weights, reach, spec);
          if (info.candidate_source) {
            shared.candidates = CandidateMask{layer, std::move(sel.candidates)};
            publish_candidates();
          }
          own = std::move(sel.topk);
        }
        observe(Component::kTopk, layer, own);  // may replace the selection (teacher forcing)
      }
      shared.topk = PublishedTopk{layer, ratio, /*offset=*/0, own};
      record.topk.insert_or_assign(layer, std::move(own));
    }
    // The latent enters the owner's cache after the indexer used the pre-RoPE form.
    if (latents.count() > 0) {
      Tensor<float> roped = latents.latent;
      ops.rope_rows(roped, 1, rope, latents.first_group * ratio, ratio, false);
      ls.compressed_kv->write(ops, latents.first_group, roped);
    }
    DSV41_CHECK(shared.topk.has_value(), "layer ", layer, ": needs the top-k of layer ", info.topk_owner,
                ", which has not run in this step");
    const Tensor<int32_t>& topk = shared.topk->idxs_for(info.topk_owner, ratio, 0);
    compressed = owner.compressed_kv->rows(info.kv_owner, ratio, compress_len);
    // The compressed part padded with -1 to index_topk (canonical width, as the window part).
    idxs = ops.attention_index_rows(window_idxs, topk, offset, c.index_topk);
  }

  Tensor<float> o = ops.sparse_attn(std::move(q).reshaped({T, H, D}), window_kv, compressed, w.attn_sink, idxs,
                                    static_cast<float>(std::pow(static_cast<double>(D), -0.5)));  // [T, H, D]
  Tensor<float> o_flat = std::move(o).reshaped({T, H * D});
  ops.rope_rows(o_flat, H, rope, start_pos, 1, true);
  return ops.linear(ops.grouped_linear(o_flat, w.wo_a, c.o_groups), w.wo_b);
}

}  // namespace dsv41::reference::model
