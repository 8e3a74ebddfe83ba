// scenarios/bug_zoo_forwarding.h
//
// ForwardingOps: a reference::Ops that forwards every method to the CPU reference
// (reference::reference_ops()). A zoo bug (scenarios/bug_zoo.h) derives from it and overrides the
// one op it gets wrong, so the rest of the forward is exactly the reference's.
//
// It also knows which layer is running: Model::prepare hands the ops the model's RoPE tables (one
// per layer, reference/model.h), and every attention sublayer starts with the RoPE of its queries,
// so the table a rope_rows call gets names its layer. current_layer() is the layer of the latest
// rope_rows call (-1 before the first one); a bug that needs the layer (Reuse from the wrong owner,
// RoPE tables swapped) reads it. Ops are const and the model calls them in order from one thread,
// so this bookkeeping is mutable state.
#pragma once

#include <string>
#include <vector>

#include "reference/ops.h"

namespace dsv41::scenarios {

class ForwardingOps : public reference::Ops {
 public:
  explicit ForwardingOps(std::string bug) : bug_(std::move(bug)) {}
  std::string name() const override { return "reference+" + bug_; }

  void prepare(const reference::ModelWeights& w, const std::vector<reference::RopeTable>& rope) const override {
    rope_ = &rope;
    ref().prepare(w, rope);
  }
  void release(const reference::ModelWeights& w, const std::vector<reference::RopeTable>& rope) const override {
    ref().release(w, rope);
  }
  // The layer whose RoPE table `rope` is (-1: none of the model's, e.g. a table the bug built).
  int layer_of(const reference::RopeTable& rope) const {
    if (rope_ == nullptr) return -1;
    for (size_t l = 0; l < rope_->size(); ++l) {
      if (&(*rope_)[l] == &rope) return static_cast<int>(l);
    }
    return -1;
  }
  int current_layer() const { return layer_; }

  using T32 = reference::Tensor<float>;
  using TI32 = reference::Tensor<int32_t>;
  using TI64 = reference::Tensor<int64_t>;
  using TU8 = reference::Tensor<uint8_t>;

  T32 upload(T32 h) const override { return ref().upload(std::move(h)); }
  TI32 upload(TI32 h) const override { return ref().upload(std::move(h)); }
  TI64 upload(TI64 h) const override { return ref().upload(std::move(h)); }
  TU8 upload(TU8 h) const override { return ref().upload(std::move(h)); }
  T32 download(T32 t) const override { return ref().download(std::move(t)); }
  TI32 download(TI32 t) const override { return ref().download(std::move(t)); }
  TI64 download(TI64 t) const override { return ref().download(std::move(t)); }
  TU8 download(TU8 t) const override { return ref().download(std::move(t)); }
  T32 slice_rows(const T32& x, int64_t f, int64_t n) const override { return ref().slice_rows(x, f, n); }
  TU8 slice_rows(const TU8& x, int64_t f, int64_t n) const override { return ref().slice_rows(x, f, n); }
  TI32 slice_rows(const TI32& x, int64_t f, int64_t n) const override { return ref().slice_rows(x, f, n); }

  T32 embed(const std::vector<int64_t>& tokens, const T32& table, int64_t hc) const override {
    return ref().embed(tokens, table, hc);
  }
  T32 linear(const T32& x, const reference::LinearWeight& w) const override { return ref().linear(x, w); }
  T32 linear_fp32(const T32& x, const reference::LinearWeight& w) const override { return ref().linear_fp32(x, w); }
  T32 grouped_linear(const T32& x, const reference::LinearWeight& w, int groups) const override {
    return ref().grouped_linear(x, w, groups);
  }
  T32 rms_norm(const T32& x, const T32& weight, double eps) const override { return ref().rms_norm(x, weight, eps); }
  // Records the layer (above), then the reference's RoPE.
  void rope_rows(T32& x, int64_t heads, const reference::RopeTable& rope, int64_t first_pos, int64_t pos_stride,
                 bool inverse) const override {
    note_layer(rope);
    ref().rope_rows(x, heads, rope, first_pos, pos_stride, inverse);
  }
  T32 qdq(formats::CacheFormat f, const T32& x) const override { return ref().qdq(f, x); }
  void write_entries(TU8& storage, formats::CacheFormat f, const std::vector<int64_t>& entries,
                     const T32& rows) const override {
    ref().write_entries(storage, f, entries, rows);
  }
  T32 read_entries(const reference::CacheRows& c, const std::vector<int64_t>& e) const override {
    return ref().read_entries(c, e);
  }
  T32 concat_kv_rows(const T32& w, const T32& c) const override { return ref().concat_kv_rows(w, c); }
  TI32 attention_index_rows(const TI32& window, const TI32& topk, int64_t offset, int64_t width) const override {
    return ref().attention_index_rows(window, topk, offset, width);
  }
  T32 sparse_attn(const T32& q, const T32& window_kv, const reference::CacheRows& compressed, const T32& sink,
                  const TI32& idxs, float scale) const override {
    return ref().sparse_attn(q, window_kv, compressed, sink, idxs, scale);
  }
  reference::CompressedLatents compress(const T32& kv, const T32& score, int64_t start_pos, int ratio, T32& kv_state,
                                        T32& score_state) const override {
    return ref().compress(kv, score, start_pos, ratio, kv_state, score_state);
  }
  T32 index_weights(const T32& proj, int d) const override { return ref().index_weights(proj, d); }
  T32 index_scores(const T32& q, const reference::CacheRows& keys, const T32& w,
                   const std::vector<int64_t>& reach) const override {
    return ref().index_scores(q, keys, w, reach);
  }
  TU8 candidate_blocks(const T32& scores, const std::vector<int64_t>& reach, int topk_blocks,
                       int block_size) const override {
    return ref().candidate_blocks(scores, reach, topk_blocks, block_size);
  }
  void mask_scores(T32& scores, const TU8& mask) const override { ref().mask_scores(scores, mask); }
  TI32 index_topk(const T32& scores, const std::vector<int64_t>& reach, int k) const override {
    return ref().index_topk(scores, reach, k);
  }
  reference::HcMixes hc_mixes(const T32& stream, const reference::HcWeights& w, double norm_eps, int iters,
                              double hc_eps) const override {
    return ref().hc_mixes(stream, w, norm_eps, iters, hc_eps);
  }
  T32 hc_identity_pre(int64_t tokens, int64_t hc) const override { return ref().hc_identity_pre(tokens, hc); }
  T32 hc_pre(const T32& stream, const T32& pre) const override { return ref().hc_pre(stream, pre); }
  T32 hc_post(const T32& f, const T32& residual, const T32& post, const T32& comb) const override {
    return ref().hc_post(f, residual, post, comb);
  }
  TI64 engram_hash_ids(const reference::EngramLayout& layout, int layer_index, const reference::EngramHistory& h,
                       int64_t start_pos, int64_t count) const override {
    return ref().engram_hash_ids(layout, layer_index, h, start_pos, count);
  }
  T32 engram_lookup(const reference::EngramWeights& w, int head_dim, const TI64& ids) const override {
    return ref().engram_lookup(w, head_dim, ids);
  }
  T32 engram_gate_residual(const T32& x, const T32& kv, const reference::EngramWeights& w, double eps) const override {
    return ref().engram_gate_residual(x, kv, w, eps);
  }
  reference::MoeRouting moe_gate(const T32& x, const reference::MoeWeights& w, const reference::ModelConfig& c,
                                 int layer) const override {
    return ref().moe_gate(x, w, c, layer);
  }
  void moe_routing_weights(reference::MoeRouting& r, const reference::ModelConfig& c) const override {
    ref().moe_routing_weights(r, c);
  }
  T32 moe_experts(const T32& x, const reference::MoeWeights& w, const reference::MoeRouting& r,
                  const reference::ModelConfig& c) const override {
    return ref().moe_experts(x, w, r, c);
  }
  T32 hc_mean(const T32& stream) const override { return ref().hc_mean(stream); }
  T32 concat_cols(const std::vector<T32>& parts) const override { return ref().concat_cols(parts); }
  T32 concat_rows(const std::vector<T32>& parts) const override { return ref().concat_rows(parts); }
  void add_markov_bias(T32& logits, int64_t slot, const T32& bias) const override {
    ref().add_markov_bias(logits, slot, bias);
  }

 protected:
  static const reference::Ops& ref() { return reference::reference_ops(); }
  // What rope_rows does first: the layer of the table becomes current_layer().
  void note_layer(const reference::RopeTable& rope) const {
    const int l = layer_of(rope);
    if (l >= 0) layer_ = l;
  }

 private:
  std::string bug_;
  mutable const std::vector<reference::RopeTable>* rope_ = nullptr;
  mutable int layer_ = -1;
};

}  // namespace dsv41::scenarios
