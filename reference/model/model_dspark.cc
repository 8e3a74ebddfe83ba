// reference/model/model_dspark.cc
//
// The DSpark draft head's orchestration (reference/model/model.h states the contract, docs/dspark.md
// the semantics): what a forward step writes into the DSpark rings, and Model::draft. Every value
// is computed by an op (reference/ops/dspark.h and the ordinary components); this file decides which
// op runs on what, at which positions, and which ring each block reads and writes. The official
// counterparts (model.py): Transformer.forward's main_hidden capture, DSparkBlock.forward_embed /
// forward / forward_head, DSparkAttention.forward, sample().
#include <algorithm>
#include <cmath>
#include <random>

#include "base/error.h"
#include "reference/model/forward.h"
#include "reference/model/model.h"
#include "reference/ops/sampling.h"

namespace dsv41::reference::model {
namespace {

// The window_kv rows of main_x for one DSpark block: kv_norm(wkv(main_x)), RoPE at positions
// first_pos .. (the block's window table), the ring format's QDQ. main_x: [T, dim] bf16 ->
// [T, head_dim] bf16 (official DSparkAttention.forward, main_kv).
Tensor<float> main_kv_rows(const seam::Ops& ops, const Tensor<float>& main_x, int64_t first_pos, const ModelConfig& c,
                           const checkpoint::AttentionWeights& w, const RopeTable& rope, formats::CacheFormat format) {
  Tensor<float> kv = ops.rms_norm(ops.linear(main_x, w.wkv), w.kv_norm, c.norm_eps);  // [T, D] bf16
  ops.rope_rows(kv, 1, rope, first_pos, 1, false);
  return ops.qdq(format, kv);
}

// The DSpark attention of one block over a draft (official DSparkAttention.forward, decode
// branch). x: [B, dim] bf16, the attn_norm output of the draft rows at positions first ..
// first + B - 1 -> [B, dim] bf16. The ring holds the main positions up to first - 1 (checked by
// the caller); its slots 0 .. n - 1 (n = min(W, first)) are read in slot order, then the draft's
// own K/V rows: every query row sees all of them (no causal mask within the block).
Tensor<float> dspark_attention(const seam::Ops& ops, const Tensor<float>& x, int64_t first, const ModelConfig& c,
                               const checkpoint::AttentionWeights& w, const RopeTable& rope, const WindowKvRing& ring) {
  const int64_t B = x.dim(0), H = c.n_heads, D = c.head_dim;
  const Tensor<float> qr = ops.rms_norm(ops.linear(x, w.wq_a), w.q_norm, c.norm_eps);  // [B, q_lora] bf16
  Tensor<float> q = ops.linear(qr, w.wq_b);                                              // [B, H*D] bf16
  ops.rope_rows(q, H, rope, first, 1, false);
  const Tensor<float> kv = main_kv_rows(ops, x, first, c, w, rope, ring.format);  // [B, D]: the draft's own
  const int64_t n = std::min<int64_t>(ring.window, first);
  const Tensor<float> rows = ops.concat_kv_rows(ring.read_slots(ops, n), kv);  // [n + B, D]
  const Tensor<int32_t> idxs = ops.upload(dspark_index_rows(n, B));           // [B, n + B]
  Tensor<float> o = ops.sparse_attn(std::move(q).reshaped({B, H, D}), rows, CacheRows{}, w.attn_sink, idxs,
                                    static_cast<float>(std::pow(static_cast<double>(D), -0.5)));  // [B, H, D]
  Tensor<float> o_flat = std::move(o).reshaped({B, H * D});
  ops.rope_rows(o_flat, H, rope, first, 1, true);
  return ops.linear(ops.grouped_linear(o_flat, w.wo_a, c.o_groups), w.wo_b);
}

// A dsv41::Error unless slots 0 .. min(W, last + 1) - 1 of `ring` hold the main positions that
// a draft after position `last` reads: slot s the latest position <= last with position % W == s.
void check_ring(const WindowKvRing& ring, int64_t last, int layer) {
  const int64_t W = ring.window, n = std::min<int64_t>(W, last + 1);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t want = last - ((last - s) % W), held = ring.positions[static_cast<size_t>(s)];
    if (held != want) {
      DSV41_FAIL("draft: the DSpark ring of layer ", layer, " holds position ", held, " in slot ", s,
                 ", a draft after position ", last, " needs position ", want,
                 " (the rings are written by forward steps: a state rolled back or resumed without them?)");
    }
  }
}

}  // namespace

void Model::dspark_write(ModelState& state, std::vector<Tensor<float>> parts, int64_t first_pos, int64_t rows,
                         const Observer& observe) const {
  const ModelConfig& c = config_;
  const seam::Ops& ops = *ops_;
  DSV41_CHECK(parts.size() == c.dspark_target_layer_ids.size(), "DSpark: ", parts.size(), " target layers ran, ",
              c.dspark_target_layer_ids.size(), " expected");
  DSV41_CHECK(static_cast<int>(state.dspark_window_kv.size()) == c.n_mtp_layers, "DSpark: the state has ",
              state.dspark_window_kv.size(), " DSpark rings, the config ", c.n_mtp_layers,
              " (a state comes from Model::new_state)");
  for (Tensor<float>& p : parts) {  // decoder replay: a target before the cut ran on more rows
    if (p.dim(0) > rows) p = ops.slice_rows(p, p.dim(0) - rows, rows);
  }
  // main_hidden [rows, n_targets * dim] bf16 -> main_x [rows, dim] bf16.
  Tensor<float> main_x = ops.rms_norm(ops.linear(ops.concat_cols(parts), weights_.dspark.main_proj),
                                      weights_.dspark.main_norm, c.norm_eps);
  observe(Component::kDSparkMainX, -1, main_x);
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    const int layer = c.n_layers + i;
    WindowKvRing& ring = state.dspark_window_kv[static_cast<size_t>(i)];
    Tensor<float> kv = main_kv_rows(ops, main_x, first_pos, c, weights_.blocks[static_cast<size_t>(layer)].attn,
                                    rope_[static_cast<size_t>(layer)], ring.format);  // [rows, D]
    observe(Component::kDSparkMainKv, layer, kv);
    const int64_t kept = std::min<int64_t>(rows, ring.window);  // the ring keeps the last W positions
    ring.write(ops, first_pos + rows - kept, rows > kept ? ops.slice_rows(kv, rows - kept, kept) : kv);
  }
}

DraftResult Model::draft(const ModelState& state, int64_t last_token, const DraftSampling& sampling) const {
  const ModelConfig& c = config_;
  const seam::Ops& ops = *ops_;
  DSV41_CHECK(c.n_mtp_layers > 0, "draft: the config has no DSpark blocks (n_mtp_layers = 0)");
  check_precision(state);
  DSV41_CHECK(static_cast<int>(state.dspark_window_kv.size()) == c.n_mtp_layers, "draft: the state has ",
              state.dspark_window_kv.size(), " DSpark rings, the config ", c.n_mtp_layers,
              " (a state comes from Model::new_state)");
  DSV41_CHECK(state.pos >= 1, "draft: the state is fresh (position 0): a draft continues a sequence; run "
              "prefill or forward_chunk first (they write the DSpark rings the draft reads)");
  DSV41_CHECK(last_token >= 0 && last_token < c.vocab_size, "draft: last token ", last_token,
              " is outside the vocab [0, ", c.vocab_size, ")");
  DSV41_CHECK(std::isfinite(sampling.temperature) && sampling.temperature >= 0.0, "draft: temperature ",
              sampling.temperature, " (want a finite value >= 0)");
  const int64_t B = c.dspark_block_size, first = state.pos, hc = c.hc_mult, V = c.vocab_size;
  DSV41_CHECK(first + B <= c.max_seq_len, "draft: block positions ", first, "..", first + B - 1,
              " exceed max_seq_len ", c.max_seq_len);
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    check_ring(state.dspark_window_kv[static_cast<size_t>(i)], first - 1, c.n_layers + i);
  }
  const Observer observe(ops, hooks_);
  const BlockContext block{ops, c, observe};

  // forward_embed: [last token, noise x (B - 1)], embedded and copied to the hc streams.
  std::vector<int64_t> ids(static_cast<size_t>(B), c.dspark_noise_token_id);
  ids[0] = last_token;
  Tensor<float> stream = ops.embed(ids, weights_.embed, hc);  // [B, hc, dim] bf16
  observe(Component::kDSparkEmbed, -1, stream);
  Tensor<float> pre = ops.hc_identity_pre(B, hc);  // [B, hc] fp32
  // The DSpark blocks: ordinary Blocks around DSparkAttention (the backbone's single-pass mHC).
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    const int layer = c.n_layers + i;
    const checkpoint::BlockWeights& bw = weights_.blocks[static_cast<size_t>(layer)];
    observe(Component::kDSparkInStream, layer, stream);
    const WindowKvRing& ring = state.dspark_window_kv[static_cast<size_t>(i)];
    const RopeTable& rope = rope_[static_cast<size_t>(layer)];
    block_forward(block, kDSparkBlock, layer, bw,
                  [&](const Tensor<float>& x) { return dspark_attention(ops, x, first, c, bw.attn, rope, ring); },
                  stream, pre);
  }

  // forward_head: x = hc_pre (the confidence reads x BEFORE the norm), logits = head(norm(x)).
  const Tensor<float> x = ops.hc_pre(stream, pre);  // [B, dim] bf16
  Tensor<float> h = ops.rms_norm(x, weights_.dspark.norm, c.norm_eps);
  observe(Component::kDSparkNormOut, -1, h);
  Tensor<float> logits = ops.linear_fp32(h, weights_.head);  // [B, V] fp32
  observe(Component::kDSparkHeadLogits, -1, logits);

  // The Markov chain: slot i adds the bias of the token before it, then draws the next token.
  DraftResult r;
  r.position = first;
  r.last_token = last_token;
  r.probs = Tensor<float>({B, V}, "draft_probs");
  std::mt19937_64 rng(sampling.seed);
  std::vector<int64_t> chain = {last_token};
  std::vector<Tensor<float>> embeds;  // [B] of [1, rank]
  for (int64_t i = 0; i < B; ++i) {
    Tensor<float> e = ops.embed({chain.back()}, weights_.dspark.markov_embed, 1).reshaped({1, c.dspark_markov_rank});
    observe(Component::kDSparkMarkovEmbed, static_cast<int>(i), e);
    Tensor<float> bias = ops.linear_fp32(e, weights_.dspark.markov_head);  // [1, V] fp32
    observe(Component::kDSparkMarkovBias, static_cast<int>(i), bias);
    ops.add_markov_bias(logits, i, bias);
    embeds.push_back(std::move(e));
    const Tensor<float> row = ops.download(ops.slice_rows(logits, i, 1));  // the sampler runs on the host
    const std::vector<float> p = sampling_probs(row.row(0), V, sampling.temperature);
    std::copy(p.begin(), p.end(), r.probs.row(i));
    Tensor<int32_t> tok({1, 1}, {static_cast<int32_t>(sample(row.row(0), V, sampling.temperature, rng))}, "draft_token");
    observe(Component::kDSparkToken, static_cast<int>(i), tok);  // teacher forcing may replace it
    DSV41_CHECK(tok.at(0, 0) >= 0 && tok.at(0, 0) < V, "draft: slot ", i, " token ", tok.at(0, 0), " outside the vocab");
    chain.push_back(tok.at(0, 0));
  }
  observe(Component::kDSparkLogits, -1, logits);
  // confidence = Linear_fp32(cat(x, markov embeds)) -> [B] logits.
  Tensor<float> conf = ops.linear_fp32(ops.concat_cols({x, ops.concat_rows(embeds)}), weights_.dspark.confidence_proj)
                           .reshaped({B});
  observe(Component::kDSparkConfidence, -1, conf);

  r.tokens.assign(chain.begin() + 1, chain.end());
  r.logits = ops.download(std::move(logits));
  r.confidence = ops.download(std::move(conf)).data();
  return r;
}

}  // namespace dsv41::reference::model
