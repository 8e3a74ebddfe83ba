// tests/support/fake_device_ops.h
//
// FakeDeviceOps: a second implementation of the ops seam (reference/seam/ops.h) whose tensors live in
// a pretend device memory (FakeStorage: host memory the model cannot read). Each op takes its
// inputs out of that memory, runs the reference op of the same name, and puts its outputs back.
// It proves three things about the model when a forward runs through it:
//   - the model reaches every component through the seam: a tensor the model read or wrote itself
//     would be a device tensor read on the host, which throws;
//   - the model moves data between host and device only where reference/seam/ops.h allows: `events`
//     lists every op call, upload and download in order;
//   - the results are the reference's bit for bit (the same functions do the arithmetic).
// Activations passed to an op must be device tensors (a host tensor where the model should pass
// a device one is an error naming the op); weights are host tensors by design (ModelWeights).
//
// Example:
//   FakeDeviceOps fake;
//   reference::model::Model m(config, weights, token_map, fake);
//   reference::model::ModelState s = m.new_state();
//   m.prefill(s, tokens);
//   EXPECT_GT(fake.calls.at("sparse_attn"), 0);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "reference/seam/ops.h"

namespace dsv41::test {

template <typename T>
class FakeStorage final : public reference::DeviceStorage {
 public:
  explicit FakeStorage(std::vector<T> v) : values(std::move(v)) {}
  std::string where() const override { return "fake-device"; }
  std::unique_ptr<reference::DeviceStorage> clone() const override { return std::make_unique<FakeStorage>(values); }
  std::vector<T> values;
};

class FakeDeviceOps final : public reference::seam::Ops {
 public:
  template <typename T>
  using Tensor = reference::Tensor<T>;
  using CacheRows = reference::CacheRows;

  // Every op call ("linear", ...), "upload" and "download" the model asked for, in order.
  mutable std::vector<std::string> events;
  mutable std::map<std::string, int64_t> calls;  // per op name (uploads and downloads included)

  void clear() const {
    events.clear();
    calls.clear();
  }

  std::string name() const override { return "fake-device"; }

  // ---- memory: the model's own transfers ----
  Tensor<float> upload(Tensor<float> t) const override { return up(std::move(t)); }
  Tensor<int32_t> upload(Tensor<int32_t> t) const override { return up(std::move(t)); }
  Tensor<int64_t> upload(Tensor<int64_t> t) const override { return up(std::move(t)); }
  Tensor<uint8_t> upload(Tensor<uint8_t> t) const override { return up(std::move(t)); }
  Tensor<float> download(Tensor<float> t) const override { return down(std::move(t)); }
  Tensor<int32_t> download(Tensor<int32_t> t) const override { return down(std::move(t)); }
  Tensor<int64_t> download(Tensor<int64_t> t) const override { return down(std::move(t)); }
  Tensor<uint8_t> download(Tensor<uint8_t> t) const override { return down(std::move(t)); }

  Tensor<float> slice_rows(const Tensor<float>& x, int64_t first, int64_t count) const override {
    return dev(reference::slice_rows(in(x, "slice_rows"), first, count));
  }
  Tensor<uint8_t> slice_rows(const Tensor<uint8_t>& x, int64_t first, int64_t count) const override {
    return dev(reference::slice_rows(in(x, "slice_rows"), first, count));
  }
  Tensor<int32_t> slice_rows(const Tensor<int32_t>& x, int64_t first, int64_t count) const override {
    return dev(reference::slice_rows(in(x, "slice_rows"), first, count));
  }

  Tensor<float> embed(const std::vector<int64_t>& tokens, const Tensor<float>& table, int64_t hc) const override {
    note("embed");
    return dev(ref().embed(tokens, table, hc));
  }
  Tensor<float> linear(const Tensor<float>& x, const reference::LinearWeight& w) const override {
    return dev(ref().linear(in(x, "linear"), w));
  }
  Tensor<float> linear_fp32(const Tensor<float>& x, const reference::LinearWeight& w) const override {
    return dev(ref().linear_fp32(in(x, "linear_fp32"), w));
  }
  Tensor<float> grouped_linear(const Tensor<float>& x, const reference::LinearWeight& w, int groups) const override {
    return dev(ref().grouped_linear(in(x, "grouped_linear"), w, groups));
  }
  Tensor<float> rms_norm(const Tensor<float>& x, const Tensor<float>& weight, double eps) const override {
    return dev(ref().rms_norm(in(x, "rms_norm"), weight, eps));
  }
  void rope_rows(Tensor<float>& x, int64_t heads, const reference::RopeTable& rope, int64_t first_pos,
                 int64_t pos_stride, bool inverse) const override {
    Tensor<float> h = in(x, "rope_rows");
    ref().rope_rows(h, heads, rope, first_pos, pos_stride, inverse);
    x = dev(std::move(h));
  }
  Tensor<float> qdq(formats::CacheFormat format, const Tensor<float>& x) const override {
    return dev(ref().qdq(format, in(x, "qdq")));
  }
  void write_entries(Tensor<uint8_t>& storage, formats::CacheFormat format, const std::vector<int64_t>& entries,
                     const Tensor<float>& rows) const override {
    Tensor<uint8_t> h = in(storage, "write_entries");
    ref().write_entries(h, format, entries, host_of(rows, "write_entries"));
    storage = dev(std::move(h));
  }
  Tensor<float> read_entries(const CacheRows& cache, const std::vector<int64_t>& entries) const override {
    note("read_entries");
    const Tensor<uint8_t> bytes = host_of(*cache.bytes, "read_entries");
    return dev(ref().read_entries(CacheRows{cache.format, cache.dim, cache.count, &bytes}, entries));
  }
  Tensor<float> concat_kv_rows(const Tensor<float>& window, const Tensor<float>& compressed) const override {
    return dev(ref().concat_kv_rows(in(window, "concat_kv_rows"), host_of(compressed, "concat_kv_rows")));
  }
  Tensor<int32_t> attention_index_rows(const Tensor<int32_t>& window, const Tensor<int32_t>& topk, int64_t offset,
                                       int64_t width) const override {
    return dev(ref().attention_index_rows(in(window, "attention_index_rows"), host_of(topk, "attention_index_rows"),
                                          offset, width));
  }
  Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& window_kv, const CacheRows& compressed,
                            const Tensor<float>& sink, const Tensor<int32_t>& idxs,
                            float softmax_scale) const override {
    note("sparse_attn");
    Tensor<uint8_t> bytes;
    CacheRows c = compressed;
    if (compressed.bytes != nullptr) {
      bytes = host_of(*compressed.bytes, "sparse_attn");
      c.bytes = &bytes;
    }
    return dev(ref().sparse_attn(host_of(q, "sparse_attn"), host_of(window_kv, "sparse_attn"), c, sink,
                                 host_of(idxs, "sparse_attn"), softmax_scale));
  }
  reference::CompressedLatents compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos,
                                        int ratio, Tensor<float>& kv_state, Tensor<float>& score_state) const override {
    note("compress");
    Tensor<float> ks = host_of(kv_state, "compress"), ss = host_of(score_state, "compress");
    reference::CompressedLatents out =
        ref().compress(host_of(kv, "compress"), host_of(score, "compress"), start_pos, ratio, ks, ss);
    kv_state = dev(std::move(ks));
    score_state = dev(std::move(ss));
    out.latent = dev(std::move(out.latent));
    return out;
  }
  Tensor<float> index_weights(const Tensor<float>& proj, int index_head_dim) const override {
    return dev(ref().index_weights(in(proj, "index_weights"), index_head_dim));
  }
  Tensor<float> index_scores(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& weights,
                             const std::vector<int64_t>& reach) const override {
    note("index_scores");
    const Tensor<uint8_t> bytes = host_of(*keys.bytes, "index_scores");
    return dev(ref().index_scores(host_of(q, "index_scores"), CacheRows{keys.format, keys.dim, keys.count, &bytes},
                                  host_of(weights, "index_scores"), reach));
  }
  Tensor<uint8_t> candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach, int topk_blocks,
                                   int block_size) const override {
    return dev(ref().candidate_blocks(in(scores, "candidate_blocks"), reach, topk_blocks, block_size));
  }
  void mask_scores(Tensor<float>& scores, const Tensor<uint8_t>& mask) const override {
    Tensor<float> h = in(scores, "mask_scores");
    ref().mask_scores(h, host_of(mask, "mask_scores"));
    scores = dev(std::move(h));
  }
  Tensor<int32_t> index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach, int k) const override {
    return dev(ref().index_topk(in(scores, "index_topk"), reach, k));
  }
  reference::HcMixes hc_mixes(const Tensor<float>& stream, const reference::HcWeights& w, double norm_eps, int iters,
                              double hc_eps) const override {
    reference::HcMixes m = ref().hc_mixes(in(stream, "hc_mixes"), w, norm_eps, iters, hc_eps);
    return {dev(std::move(m.pre)), dev(std::move(m.post)), dev(std::move(m.comb))};
  }
  Tensor<float> hc_identity_pre(int64_t tokens, int64_t hc) const override {
    note("hc_identity_pre");
    return dev(ref().hc_identity_pre(tokens, hc));
  }
  Tensor<float> hc_pre(const Tensor<float>& stream, const Tensor<float>& pre) const override {
    return dev(ref().hc_pre(in(stream, "hc_pre"), host_of(pre, "hc_pre")));
  }
  Tensor<float> hc_post(const Tensor<float>& f, const Tensor<float>& residual, const Tensor<float>& post,
                        const Tensor<float>& comb) const override {
    return dev(ref().hc_post(in(f, "hc_post"), host_of(residual, "hc_post"), host_of(post, "hc_post"),
                             host_of(comb, "hc_post")));
  }
  Tensor<int64_t> engram_hash_ids(const reference::EngramLayout& layout, int layer_index,
                                  const reference::EngramHistory& history, int64_t start_pos,
                                  int64_t count) const override {
    note("engram_hash_ids");
    return dev(ref().engram_hash_ids(layout, layer_index, history, start_pos, count));
  }
  Tensor<float> engram_lookup(const reference::EngramWeights& w, int head_dim,
                              const Tensor<int64_t>& ids) const override {
    return dev(ref().engram_lookup(w, head_dim, in(ids, "engram_lookup")));
  }
  Tensor<float> engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv, const reference::EngramWeights& w,
                                     double eps) const override {
    return dev(ref().engram_gate_residual(in(x, "engram_gate_residual"), host_of(kv, "engram_gate_residual"), w, eps));
  }
  reference::MoeRouting moe_gate(const Tensor<float>& x, const reference::MoeWeights& w,
                                 const reference::ModelConfig& c, int layer) const override {
    reference::MoeRouting r = ref().moe_gate(in(x, "moe_gate"), w, c, layer);
    return {dev(std::move(r.experts)), dev(std::move(r.weights)), dev(std::move(r.scores))};
  }
  void moe_routing_weights(reference::MoeRouting& r, const reference::ModelConfig& c) const override {
    note("moe_routing_weights");
    reference::MoeRouting h{host_of(r.experts, "moe_routing_weights"), host_of(r.weights, "moe_routing_weights"),
                            host_of(r.scores, "moe_routing_weights")};
    ref().moe_routing_weights(h, c);
    r = {dev(std::move(h.experts)), dev(std::move(h.weights)), dev(std::move(h.scores))};
  }
  Tensor<float> moe_experts(const Tensor<float>& x, const reference::MoeWeights& w, const reference::MoeRouting& routing,
                            const reference::ModelConfig& c) const override {
    note("moe_experts");
    const reference::MoeRouting h{host_of(routing.experts, "moe_experts"), host_of(routing.weights, "moe_experts"),
                                  host_of(routing.scores, "moe_experts")};
    return dev(ref().moe_experts(host_of(x, "moe_experts"), w, h, c));
  }
  Tensor<float> hc_mean(const Tensor<float>& stream) const override { return dev(ref().hc_mean(in(stream, "hc_mean"))); }
  Tensor<float> concat_cols(const std::vector<Tensor<float>>& parts) const override {
    note("concat_cols");
    std::vector<Tensor<float>> h;
    for (const Tensor<float>& p : parts) h.push_back(host_of(p, "concat_cols"));
    return dev(ref().concat_cols(h));
  }
  Tensor<float> concat_rows(const std::vector<Tensor<float>>& parts) const override {
    note("concat_rows");
    std::vector<Tensor<float>> h;
    for (const Tensor<float>& p : parts) h.push_back(host_of(p, "concat_rows"));
    return dev(ref().concat_rows(h));
  }
  void add_markov_bias(Tensor<float>& logits, int64_t slot, const Tensor<float>& bias) const override {
    Tensor<float> h = in(logits, "add_markov_bias");
    ref().add_markov_bias(h, slot, host_of(bias, "add_markov_bias"));
    logits = dev(std::move(h));
  }

 private:
  static const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }

  void note(const char* op) const {
    events.emplace_back(op);
    ++calls[op];
  }
  // A device tensor's values on the host (no event: the op's own access).
  template <typename T>
  static Tensor<T> host_of(const Tensor<T>& t, const char* op) {
    DSV41_CHECK(!t.on_host(), "fake device: op ", op, " got the host tensor '", t.name(),
                "' where the model must pass a tensor of the ops' memory");
    const auto* s = dynamic_cast<const FakeStorage<T>*>(t.storage());
    DSV41_CHECK(s != nullptr, "fake device: '", t.name(), "' lives in ", t.where());
    return Tensor<T>(t.shape(), s->values, t.name());
  }
  // An op's first input: notes the op, then host_of.
  template <typename T>
  Tensor<T> in(const Tensor<T>& t, const char* op) const {
    note(op);
    return host_of(t, op);
  }
  template <typename T>
  static Tensor<T> dev(Tensor<T> host) {
    std::vector<int64_t> shape = host.shape();
    std::string name = host.name();
    return Tensor<T>::on_device(std::move(shape), std::make_unique<FakeStorage<T>>(std::move(host.data())),
                                std::move(name));
  }
  template <typename T>
  Tensor<T> up(Tensor<T> t) const {
    DSV41_CHECK(t.on_host(), "fake device: upload of '", t.name(), "', which is already a device tensor");
    note("upload");
    return dev(std::move(t));
  }
  template <typename T>
  Tensor<T> down(Tensor<T> t) const {
    note("download");
    return host_of(t, "download");
  }
};

}  // namespace dsv41::test
