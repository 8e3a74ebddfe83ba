// tests/support/forwarding_ops.h
//
// ForwardingOps: an ops table (reference/ops.h) that forwards every method to another one (the
// reference's by default). A test derives from it and overrides one op to plant a defect, e.g. a
// result moved a few ulps (tests/scenarios/exact_eval_test.cc).
//
// Example:
//   struct Off : ForwardingOps { Tensor<float> rms_norm(...) const override { ... } };
#pragma once

#include <string>
#include <vector>

#include "reference/ops.h"

namespace dsv41::test {

class ForwardingOps : public reference::Ops {
 public:
  explicit ForwardingOps(const reference::Ops& inner = reference::reference_ops()) : in_(inner) {}
  std::string name() const override { return "forwarding(" + in_.name() + ")"; }

  template <typename T>
  using Tensor = reference::Tensor<T>;
  using CacheRows = reference::CacheRows;

  Tensor<float> slice_rows(const Tensor<float>& x, int64_t f, int64_t c) const override { return in_.slice_rows(x, f, c); }
  Tensor<uint8_t> slice_rows(const Tensor<uint8_t>& x, int64_t f, int64_t c) const override { return in_.slice_rows(x, f, c); }
  Tensor<int32_t> slice_rows(const Tensor<int32_t>& x, int64_t f, int64_t c) const override { return in_.slice_rows(x, f, c); }
  Tensor<float> embed(const std::vector<int64_t>& t, const Tensor<float>& table, int64_t hc) const override {
    return in_.embed(t, table, hc);
  }
  Tensor<float> linear(const Tensor<float>& x, const reference::LinearWeight& w) const override { return in_.linear(x, w); }
  Tensor<float> linear_fp32(const Tensor<float>& x, const reference::LinearWeight& w) const override {
    return in_.linear_fp32(x, w);
  }
  Tensor<float> grouped_linear(const Tensor<float>& x, const reference::LinearWeight& w, int g) const override {
    return in_.grouped_linear(x, w, g);
  }
  Tensor<float> rms_norm(const Tensor<float>& x, const Tensor<float>& w, double eps) const override {
    return in_.rms_norm(x, w, eps);
  }
  void rope_rows(Tensor<float>& x, int64_t heads, const reference::RopeTable& rope, int64_t first, int64_t stride,
                 bool inverse) const override {
    in_.rope_rows(x, heads, rope, first, stride, inverse);
  }
  Tensor<float> qdq(formats::CacheFormat f, const Tensor<float>& x) const override { return in_.qdq(f, x); }
  void write_entries(Tensor<uint8_t>& s, formats::CacheFormat f, const std::vector<int64_t>& e,
                     const Tensor<float>& rows) const override {
    in_.write_entries(s, f, e, rows);
  }
  Tensor<float> read_entries(const CacheRows& c, const std::vector<int64_t>& e) const override {
    return in_.read_entries(c, e);
  }
  Tensor<float> concat_kv_rows(const Tensor<float>& w, const Tensor<float>& c) const override {
    return in_.concat_kv_rows(w, c);
  }
  Tensor<int32_t> attention_index_rows(const Tensor<int32_t>& w, const Tensor<int32_t>& t, int64_t o,
                                       int64_t width) const override {
    return in_.attention_index_rows(w, t, o, width);
  }
  Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& kv, const CacheRows& c, const Tensor<float>& sink,
                            const Tensor<int32_t>& idxs, float scale) const override {
    return in_.sparse_attn(q, kv, c, sink, idxs, scale);
  }
  reference::CompressedLatents compress(const Tensor<float>& kv, const Tensor<float>& s, int64_t start, int ratio,
                                        Tensor<float>& kvs, Tensor<float>& ss) const override {
    return in_.compress(kv, s, start, ratio, kvs, ss);
  }
  Tensor<float> index_weights(const Tensor<float>& p, int d) const override { return in_.index_weights(p, d); }
  Tensor<float> index_scores(const Tensor<float>& q, const CacheRows& k, const Tensor<float>& w,
                             const std::vector<int64_t>& reach) const override {
    return in_.index_scores(q, k, w, reach);
  }
  Tensor<uint8_t> candidate_blocks(const Tensor<float>& s, const std::vector<int64_t>& r, int tb, int bs) const override {
    return in_.candidate_blocks(s, r, tb, bs);
  }
  void mask_scores(Tensor<float>& s, const Tensor<uint8_t>& m) const override { in_.mask_scores(s, m); }
  Tensor<int32_t> index_topk(const Tensor<float>& s, const std::vector<int64_t>& r, int k) const override {
    return in_.index_topk(s, r, k);
  }
  reference::HcMixes hc_mixes(const Tensor<float>& s, const reference::HcWeights& w, double ne, int it,
                              double he) const override {
    return in_.hc_mixes(s, w, ne, it, he);
  }
  Tensor<float> hc_identity_pre(int64_t t, int64_t hc) const override { return in_.hc_identity_pre(t, hc); }
  Tensor<float> hc_pre(const Tensor<float>& s, const Tensor<float>& p) const override { return in_.hc_pre(s, p); }
  Tensor<float> hc_post(const Tensor<float>& f, const Tensor<float>& r, const Tensor<float>& p,
                        const Tensor<float>& c) const override {
    return in_.hc_post(f, r, p, c);
  }
  Tensor<int64_t> engram_hash_ids(const reference::EngramLayout& l, int li, const reference::EngramHistory& h, int64_t s,
                                  int64_t c) const override {
    return in_.engram_hash_ids(l, li, h, s, c);
  }
  Tensor<float> engram_lookup(const reference::EngramWeights& w, int hd, const Tensor<int64_t>& ids) const override {
    return in_.engram_lookup(w, hd, ids);
  }
  Tensor<float> engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv, const reference::EngramWeights& w,
                                     double eps) const override {
    return in_.engram_gate_residual(x, kv, w, eps);
  }
  reference::MoeRouting moe_gate(const Tensor<float>& x, const reference::MoeWeights& w, const reference::ModelConfig& c,
                                 int layer) const override {
    return in_.moe_gate(x, w, c, layer);
  }
  void moe_routing_weights(reference::MoeRouting& r, const reference::ModelConfig& c) const override {
    in_.moe_routing_weights(r, c);
  }
  Tensor<float> moe_experts(const Tensor<float>& x, const reference::MoeWeights& w, const reference::MoeRouting& r,
                            const reference::ModelConfig& c) const override {
    return in_.moe_experts(x, w, r, c);
  }
  Tensor<float> hc_mean(const Tensor<float>& s) const override { return in_.hc_mean(s); }
  Tensor<float> concat_cols(const std::vector<Tensor<float>>& p) const override { return in_.concat_cols(p); }
  Tensor<float> concat_rows(const std::vector<Tensor<float>>& p) const override { return in_.concat_rows(p); }
  void add_markov_bias(Tensor<float>& l, int64_t slot, const Tensor<float>& b) const override {
    in_.add_markov_bias(l, slot, b);
  }

 private:
  const reference::Ops& in_;
};

}  // namespace dsv41::test
