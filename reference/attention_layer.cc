#include "reference/attention_layer.h"

#include <cmath>

#include "formats/packed.h"
#include "reference/attention.h"
#include "reference/compressor.h"
#include "reference/linear.h"
#include "reference/model.h"
#include "reference/numerics.h"
#include "reference/rmsnorm.h"

namespace dsv41::reference {
namespace {

// RoPE on the last rd channels of each of `heads` vectors of width `width` per row, at the row's
// position (first_pos + t). inverse: the conjugate rotation.
void rope_rows(Tensor<float>& x, int64_t heads, int64_t width, const RopeTable& rope,
               int64_t first_pos, int64_t pos_stride, bool inverse) {
  const int64_t T = x.dim(0), rd = rope.rope_dim();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      rope.apply(x.row(t) + h * width + (width - rd), first_pos + t * pos_stride, inverse);
    }
  }
}

Tensor<float> as_heads(Tensor<float> x, int64_t heads) {  // [T, H*D] -> [T, H, D]
  const int64_t T = x.dim(0), hd = x.dim(1);
  return Tensor<float>({T, heads, hd / heads}, std::move(x.data()), x.name());
}

// The FP8 (E4M3 + E8M0/32) QDQ of each row: what the SWA ring stores. x: [T, D] bf16.
Tensor<float> fp8_qdq_rows(const Tensor<float>& x) {
  const int64_t T = x.dim(0), D = x.dim(1);
  Tensor<float> out({T, D}, "window_kv");
  std::vector<uint8_t> entry(static_cast<size_t>(formats::swa_kv_entry_bytes(static_cast<int>(D))));
  for (int64_t t = 0; t < T; ++t) {
    DSV41_CHECK(formats::pack_swa_kv(x.row(t), static_cast<int>(D), entry.data()),
                "window KV row ", t, " holds NaN/Inf");
    formats::unpack_swa_kv(entry.data(), static_cast<int>(D), out.row(t));
  }
  return out;
}

// Grouped output projection: o [T, H*D] bf16 viewed as [T, G, H*D/G]; group g uses rows
// [g*o_lora, (g+1)*o_lora) of wo_a (bf16) -> [T, G*o_lora] bf16 (fp32 accumulation, then bf16).
Tensor<float> grouped_wo_a(const Tensor<float>& o, const LinearWeight& wo_a, int groups) {
  const int64_t T = o.dim(0), width = o.dim(1) / groups, o_lora = wo_a.out / groups;
  Tensor<float> out({T, groups * o_lora}, "wo_a_out");
  for (int64_t t = 0; t < T; ++t) {
    for (int g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < o_lora; ++r) {
        const float* wrow = wo_a.w.data() + (g * o_lora + r) * width;
        out.at(t, g * o_lora + r) = round_to_bf16(dot_f64_f32(o.row(t) + g * width, wrow, width));
      }
    }
  }
  return out;
}

// Canonical window rows: query p = start_pos + t reads positions max(floor, p - W + 1) .. p in
// ascending order, as rows of a KV tensor whose row 0 holds position kv_first_pos; -1 pads the
// row to width W. -> [T, W] int32.
Tensor<int32_t> window_rows(int W, int64_t start_pos, int64_t T, int64_t kv_first_pos, int64_t floor) {
  Tensor<int32_t> out({T, W}, "window_idxs", -1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = start_pos + t, first = std::max<int64_t>(floor, p - W + 1);
    DSV41_CHECK(first >= kv_first_pos, "window row of position ", p, " needs position ", first,
                " before the first KV row ", kv_first_pos);
    for (int64_t q = first; q <= p; ++q) out.at(t, q - first) = static_cast<int32_t>(q - kv_first_pos);
  }
  return out;
}

// idx: [T, k] -> [T, width] (k <= width), the new columns -1.
Tensor<int32_t> pad_columns(const Tensor<int32_t>& idx, int64_t width) {
  const int64_t T = idx.dim(0), k = idx.dim(1);
  DSV41_CHECK(k <= width, "index rows of width ", k, " exceed the canonical width ", width);
  Tensor<int32_t> out({T, width}, idx.name(), -1);
  for (int64_t t = 0; t < T; ++t) std::copy(idx.row(t), idx.row(t) + k, out.row(t));
  return out;
}

}  // namespace

Tensor<float> attention_sublayer(const Tensor<float>& x, int64_t start_pos, const ModelConfig& c,
                                 const LayerInfo& info, const AttentionWeights& w,
                                 const RopeTable& rope, ModelState& state, SharedAttention& shared,
                                 AttentionRecord& record, const ForwardHooks* hooks,
                                 const AttentionStepMode& mode) {
  const int64_t T = x.dim(0), H = c.n_heads, D = c.head_dim;
  const int W = c.window_size, ratio = info.ratio, layer = info.layer;
  LayerState& ls = state.layers[static_cast<size_t>(layer)];
  // kBf16 (the precision ablation): no FP8 / FP4 QDQ; the caches store bf16 (their write skips it).
  const bool packed = state.precision == CachePrecision::kPacked;

  // Queries. qr is shared with the indexer.
  const Tensor<float> qr = rms_norm(linear(x, w.wq_a), w.q_norm, c.norm_eps);  // [T, q_lora] bf16
  Tensor<float> q = linear(qr, w.wq_b);                                         // [T, H*D] bf16
  rope_rows(q, H, D, rope, start_pos, 1, false);

  // Window KV: RoPE then FP8 QDQ of all D channels (rope tail included).
  Tensor<float> kv = rms_norm(linear(x, w.wkv), w.kv_norm, c.norm_eps);  // [T, D] bf16
  rope_rows(kv, 1, D, rope, start_pos, 1, false);
  if (packed) kv = fp8_qdq_rows(kv);
  // The window KV rows this chunk reads: the ring's last r positions before the chunk (the most
  // any query of it can reach back), then the chunk's own rows; row 0 holds position
  // start_pos - r. Read before the chunk overwrites ring slots.
  DSV41_CHECK(mode.window_floor >= 0 && mode.window_floor <= start_pos, "layer ", layer, ": window floor ",
              mode.window_floor, " beyond the step's start ", start_pos);
  const int64_t r = std::min<int64_t>(start_pos - mode.window_floor, W - 1);
  const Tensor<float> window_kv = concat_kv_rows(ls.ring.read_positions(start_pos - r, r), kv);
  for (int64_t t = std::max<int64_t>(0, T - W); t < T; ++t) ls.ring.write(start_pos + t, kv.row(t));
  // Canonical index rows (docs/sessions.md): query p reads positions max(0, p-W+1) .. p in
  // ascending order, padded with -1 to width W, so a row depends on p alone, never on how the
  // tokens were chunked. The official prefill has width min(T, W) and the official decode puts
  // the -1 slots first; both read the same rows in the same order.
  Tensor<int32_t> idxs = window_rows(W, start_pos, T, start_pos - r, mode.window_floor);
  const int64_t offset = window_kv.dim(0);
  Tensor<float> kv_all = window_kv;

  if (ratio > 0) {
    const int64_t end_pos = start_pos + T;
    const int64_t compress_len = end_pos / ratio;
    LayerState& owner = state.layers[static_cast<size_t>(info.kv_owner)];
    // Kv source: the compressor's latent of the groups this step completes (pre-RoPE, post-norm).
    CompressedLatents latents;
    if (info.role == LayerRole::kFull && !mode.local_only) {
      if (ratio > 1) {
        const Tensor<float> kv_c = linear_fp32(x, w.comp_wkv);    // [T, D] fp32
        const Tensor<float> score = linear_fp32(x, w.comp_wgate);  // [T, D] fp32
        latents = compress(*ls.compressor, kv_c, score, start_pos);
      } else {
        latents.first_group = start_pos;
        latents.latent = linear(x, w.comp_wkv);  // bf16 weight: [T, D] bf16
      }
      if (latents.count() > 0) latents.latent = rms_norm(latents.latent, w.comp_norm, c.norm_eps);
    }
    // Indexer (index sources) or the published top-k (Reuse layers).
    if (info.role == LayerRole::kFull || info.role == LayerRole::kReindex) {
      Tensor<int32_t> own;
      if (compress_len == 0) {
        own = Tensor<int32_t>({T, 0}, "topk");
      } else {
        if (info.role == LayerRole::kFull && latents.count() > 0) {
          Tensor<float> k = rms_norm(linear(latents.latent, w.idx_wk), w.idx_k_norm, c.norm_eps);
          rope_rows(k, 1, c.index_head_dim, rope, latents.first_group * ratio, ratio, false);
          ls.key_cache->write(latents.first_group, k);
        }
        Tensor<float> qi = linear(qr, w.idx_wq_b);  // [T, Hi*Di] bf16
        rope_rows(qi, c.index_n_heads, c.index_head_dim, rope, start_pos, 1, false);
        qi = as_heads(std::move(qi), c.index_n_heads);  // [T, Hi, Di] bf16
        if (packed) qi = fp4_qdq_index(qi);
        const Tensor<float> keys =
            owner.key_cache->read(info.kv_owner, ratio, compress_len);  // [N, Di] bf16
        const Tensor<float> weights = index_weights(linear(x, w.idx_weights_proj), c.index_head_dim);
        const std::vector<int64_t> reach = compressed_reach(start_pos, T, ratio);
        Tensor<float> scores = index_scores(qi, keys, weights, reach);
        if (info.candidate_source) {
          shared.candidates = select_candidate_blocks(scores, reach, c.candidate_topk_blocks,
                                                      c.candidate_block_size, layer);
          if (hooks) hooks->on("candidates", layer, shared.candidates->mask);
          // Recorded as the reachable part (position < reach): the pinned block may extend past
          // a query's reach, and how far depends on where the step ends, not on the selection.
          Tensor<uint8_t> reachable = shared.candidates->mask;
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t n = reach[static_cast<size_t>(t)]; n < reachable.dim(1); ++n) reachable.at(t, n) = 0;
          }
          record.candidates = std::move(reachable);
        } else if (info.uses_candidates) {
          DSV41_CHECK(shared.candidates.has_value(), "layer ", layer,
                      ": needs the candidate mask of layer ", c.candidate_source_layer,
                      ", which has not run in this step");
          apply_candidate_mask(scores, *shared.candidates, c.candidate_source_layer);
        }
        // The scores the top-k is taken from; a replacement changes the selection (the candidate
        // source's mask was already selected above).
        if (hooks) hooks->on("index_scores", layer, scores);
        PublishedTopk top = select_index_topk(scores, reach, c.index_topk, offset, layer, ratio);
        Tensor<int32_t> raw({T, top.idxs.dim(1)}, "topk");
        for (int64_t i = 0; i < raw.numel(); ++i) {
          const int32_t v = top.idxs.data()[static_cast<size_t>(i)];
          raw.data()[static_cast<size_t>(i)] = v < 0 ? -1 : static_cast<int32_t>(v - offset);
        }
        if (hooks) {
          hooks->on("topk", layer, raw);  // may replace the selection (teacher forcing)
          for (int64_t i = 0; i < raw.numel(); ++i) {
            const int32_t v = raw.data()[static_cast<size_t>(i)];
            top.idxs.data()[static_cast<size_t>(i)] = v < 0 ? -1 : static_cast<int32_t>(v + offset);
          }
        }
        own = std::move(raw);
        shared.topk = std::move(top);
      }
      if (compress_len == 0) shared.topk = PublishedTopk{layer, ratio, offset, own};
      record.topk = own;
    }
    // The latent enters the owner's cache after the indexer used the pre-RoPE form.
    if (latents.count() > 0) {
      Tensor<float> roped = latents.latent;
      rope_rows(roped, 1, D, rope, latents.first_group * ratio, ratio, false);
      ls.kv_cache->write(latents.first_group, roped);
    }
    DSV41_CHECK(shared.topk.has_value(), "layer ", layer, ": needs the top-k of layer ",
                info.topk_owner, ", which has not run in this step");
    const Tensor<int32_t>& cidx = shared.topk->idxs_for(info.topk_owner, ratio, offset);
    const Tensor<float> ckv = owner.kv_cache->read(info.kv_owner, ratio, compress_len);
    kv_all = concat_kv_rows(window_kv, ckv);
    // The compressed part padded with -1 to index_topk (canonical width, as the window part).
    idxs = concat_topk_idxs(idxs, pad_columns(cidx, c.index_topk));
  }

  Tensor<float> o = sparse_attn(as_heads(std::move(q), H), kv_all, w.attn_sink, idxs,
                                static_cast<float>(std::pow(static_cast<double>(D), -0.5)));
  Tensor<float> o_flat({T, H * D}, std::move(o.data()), "attn_o");
  rope_rows(o_flat, H, D, rope, start_pos, 1, true);
  return linear(grouped_wo_a(o_flat, w.wo_a, c.o_groups), w.wo_b);
}

}  // namespace dsv41::reference
