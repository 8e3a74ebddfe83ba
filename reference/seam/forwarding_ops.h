// reference/seam/forwarding_ops.h
//
// ForwardingOps: an ops table (reference/seam/ops.h) that forwards every method to another one
// (the CPU reference by default). Whatever wraps the seam derives from it and overrides only what
// it changes: a planted bug of the self-test's zoo (scenarios/defects/bug_zoo_ops.cc), a port's
// Python ops (python/port_ops.h), a reordered variant in a test. The rest of the forward is then
// exactly the inner table's.
//
// It also knows which layer is running: Model::prepare hands the ops the model's RoPE tables (one
// per layer, reference/model/model.h), and every attention sublayer starts with the RoPE of its
// queries, so the table a rope_rows call gets names its layer. current_layer() is the layer of
// the latest rope_rows call (-1 before the first one). Ops are const and the model calls them in
// order from one thread, so this bookkeeping is mutable state.
//
// Example:
//   struct HalfNorm : ForwardingOps {
//     Tensor<float> rms_norm(const Tensor<float>& x, const Tensor<float>& w, double eps) const override {
//       return ForwardingOps::rms_norm(x, w, eps * 0.5);
//     }
//   };
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "reference/seam/ops.h"

namespace dsv41::reference::seam {

class ForwardingOps : public Ops {
 public:
  // label: the name() a report shows ("" : "forwarding(<inner's name>)").
  explicit ForwardingOps(const Ops& inner = reference_ops(), std::string label = "")
      : inner_(inner), label_(std::move(label)) {}
  std::string name() const override { return label_.empty() ? "forwarding(" + inner_.name() + ")" : label_; }
  const Ops& inner() const { return inner_; }

  void prepare(const checkpoint::ModelWeights& w, const std::vector<RopeTable>& rope) const override {
    rope_ = &rope;
    inner_.prepare(w, rope);
  }
  void release(const checkpoint::ModelWeights& w, const std::vector<RopeTable>& rope) const override {
    inner_.release(w, rope);
  }
  // The layer whose RoPE table `rope` is (-1: none of the model's, e.g. a table a wrapper built).
  int layer_of(const RopeTable& rope) const {
    if (rope_ == nullptr) return -1;
    for (size_t l = 0; l < rope_->size(); ++l) {
      if (&(*rope_)[l] == &rope) return static_cast<int>(l);
    }
    return -1;
  }
  int current_layer() const { return layer_; }

  using T32 = Tensor<float>;
  using TI32 = Tensor<int32_t>;
  using TI64 = Tensor<int64_t>;
  using TU8 = Tensor<uint8_t>;

  T32 upload(T32 h) const override { return inner_.upload(std::move(h)); }
  TI32 upload(TI32 h) const override { return inner_.upload(std::move(h)); }
  TI64 upload(TI64 h) const override { return inner_.upload(std::move(h)); }
  TU8 upload(TU8 h) const override { return inner_.upload(std::move(h)); }
  T32 download(T32 t) const override { return inner_.download(std::move(t)); }
  TI32 download(TI32 t) const override { return inner_.download(std::move(t)); }
  TI64 download(TI64 t) const override { return inner_.download(std::move(t)); }
  TU8 download(TU8 t) const override { return inner_.download(std::move(t)); }
  T32 slice_rows(const T32& x, int64_t f, int64_t n) const override { return inner_.slice_rows(x, f, n); }
  TU8 slice_rows(const TU8& x, int64_t f, int64_t n) const override { return inner_.slice_rows(x, f, n); }
  TI32 slice_rows(const TI32& x, int64_t f, int64_t n) const override { return inner_.slice_rows(x, f, n); }

  T32 embed(const std::vector<int64_t>& tokens, const T32& table, int64_t hc) const override {
    return inner_.embed(tokens, table, hc);
  }
  T32 linear(const T32& x, const LinearWeight& w) const override { return inner_.linear(x, w); }
  T32 linear_fp32(const T32& x, const LinearWeight& w) const override { return inner_.linear_fp32(x, w); }
  T32 grouped_linear(const T32& x, const LinearWeight& w, int groups) const override {
    return inner_.grouped_linear(x, w, groups);
  }
  T32 rms_norm(const T32& x, const T32& weight, double eps) const override { return inner_.rms_norm(x, weight, eps); }
  // Records the layer (above), then the reference's RoPE.
  void rope_rows(T32& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t pos_stride,
                 bool inverse) const override {
    note_layer(rope);
    inner_.rope_rows(x, heads, rope, first_pos, pos_stride, inverse);
  }
  T32 qdq(formats::CacheFormat f, const T32& x) const override { return inner_.qdq(f, x); }
  void write_entries(TU8& storage, formats::CacheFormat f, const std::vector<int64_t>& entries,
                     const T32& rows) const override {
    inner_.write_entries(storage, f, entries, rows);
  }
  T32 read_entries(const CacheRows& c, const std::vector<int64_t>& e) const override {
    return inner_.read_entries(c, e);
  }
  T32 concat_kv_rows(const T32& w, const T32& c) const override { return inner_.concat_kv_rows(w, c); }
  TI32 attention_index_rows(const TI32& window, const TI32& topk, int64_t offset, int64_t width) const override {
    return inner_.attention_index_rows(window, topk, offset, width);
  }
  T32 sparse_attn(const T32& q, const T32& window_kv, const CacheRows& compressed, const T32& sink,
                  const TI32& idxs, float scale) const override {
    return inner_.sparse_attn(q, window_kv, compressed, sink, idxs, scale);
  }
  CompressedLatents compress(const T32& kv, const T32& score, int64_t start_pos, int ratio, T32& kv_state,
                                        T32& score_state) const override {
    return inner_.compress(kv, score, start_pos, ratio, kv_state, score_state);
  }
  T32 index_weights(const T32& proj, int d) const override { return inner_.index_weights(proj, d); }
  T32 index_scores(const T32& q, const CacheRows& keys, const T32& w,
                   const std::vector<int64_t>& reach) const override {
    return inner_.index_scores(q, keys, w, reach);
  }
  TU8 candidate_blocks(const T32& scores, const std::vector<int64_t>& reach, int topk_blocks,
                       int block_size) const override {
    return inner_.candidate_blocks(scores, reach, topk_blocks, block_size);
  }
  void mask_scores(T32& scores, const TU8& mask) const override { inner_.mask_scores(scores, mask); }
  TI32 index_topk(const T32& scores, const std::vector<int64_t>& reach, int k) const override {
    return inner_.index_topk(scores, reach, k);
  }
  HcMixes hc_mixes(const T32& stream, const HcWeights& w, double norm_eps, int iters,
                              double hc_eps) const override {
    return inner_.hc_mixes(stream, w, norm_eps, iters, hc_eps);
  }
  T32 hc_identity_pre(int64_t tokens, int64_t hc) const override { return inner_.hc_identity_pre(tokens, hc); }
  T32 hc_pre(const T32& stream, const T32& pre) const override { return inner_.hc_pre(stream, pre); }
  T32 hc_post(const T32& f, const T32& residual, const T32& post, const T32& comb) const override {
    return inner_.hc_post(f, residual, post, comb);
  }
  TI64 engram_hash_ids(const EngramLayout& layout, int layer_index, const EngramHistory& h,
                       int64_t start_pos, int64_t count) const override {
    return inner_.engram_hash_ids(layout, layer_index, h, start_pos, count);
  }
  T32 engram_lookup(const EngramWeights& w, int head_dim, const TI64& ids) const override {
    return inner_.engram_lookup(w, head_dim, ids);
  }
  T32 engram_gate_residual(const T32& x, const T32& kv, const EngramWeights& w, double eps) const override {
    return inner_.engram_gate_residual(x, kv, w, eps);
  }
  MoeRouting moe_gate(const T32& x, const MoeWeights& w, const ModelConfig& c,
                                 int layer) const override {
    return inner_.moe_gate(x, w, c, layer);
  }
  void moe_routing_weights(MoeRouting& r, const ModelConfig& c) const override {
    inner_.moe_routing_weights(r, c);
  }
  T32 moe_experts(const T32& x, const MoeWeights& w, const MoeRouting& r,
                  const ModelConfig& c) const override {
    return inner_.moe_experts(x, w, r, c);
  }
  T32 hc_mean(const T32& stream) const override { return inner_.hc_mean(stream); }
  T32 concat_cols(const std::vector<T32>& parts) const override { return inner_.concat_cols(parts); }
  T32 concat_rows(const std::vector<T32>& parts) const override { return inner_.concat_rows(parts); }
  void add_markov_bias(T32& logits, int64_t slot, const T32& bias) const override {
    inner_.add_markov_bias(logits, slot, bias);
  }

 protected:
  // What rope_rows does first: the layer of the table becomes current_layer().
  void note_layer(const RopeTable& rope) const {
    const int l = layer_of(rope);
    if (l >= 0) layer_ = l;
  }

 private:
  const Ops& inner_;
  std::string label_;
  mutable const std::vector<RopeTable>* rope_ = nullptr;
  mutable int layer_ = -1;
};

}  // namespace dsv41::reference::seam
