// reference/seam/reference_ops.cc
//
// The CPU reference behind the ops seam (reference/seam/ops.h): every method calls the component
// function of the same name (reference/ops/<component>.h), which is the spec. Host memory only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/env_switch.h"
#include "base/error.h"
#include "reference/ops/attention_rows.h"
#include "reference/seam/ops.h"

namespace dsv41::reference::seam {

// ---- defaults of the memory methods: host memory, nothing to move ----

void Ops::prepare(const checkpoint::ModelWeights&, const std::vector<RopeTable>&) const {}
void Ops::release(const checkpoint::ModelWeights&, const std::vector<RopeTable>&) const {}
Tensor<float> Ops::upload(Tensor<float> host) const { return host; }
Tensor<int32_t> Ops::upload(Tensor<int32_t> host) const { return host; }
Tensor<int64_t> Ops::upload(Tensor<int64_t> host) const { return host; }
Tensor<uint8_t> Ops::upload(Tensor<uint8_t> host) const { return host; }
Tensor<float> Ops::download(Tensor<float> t) const { return t; }
Tensor<int32_t> Ops::download(Tensor<int32_t> t) const { return t; }
Tensor<int64_t> Ops::download(Tensor<int64_t> t) const { return t; }
Tensor<uint8_t> Ops::download(Tensor<uint8_t> t) const { return t; }

IndexSelection Ops::index_select(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& weights,
                                 const std::vector<int64_t>& reach, const IndexSelectSpec& spec) const {
  DSV41_CHECK(!(spec.candidate_topk_blocks > 0 && spec.pool != nullptr),
              "index_select: a layer is either the candidate source or inside its pool, not both");
  IndexSelection out;
  Tensor<float> scores = index_scores(q, keys, weights, reach);  // [T, N] bf16
  if (spec.candidate_topk_blocks > 0) {
    out.candidates = candidate_blocks(scores, reach, spec.candidate_topk_blocks, spec.candidate_block_size);
  } else if (spec.pool != nullptr) {
    mask_scores(scores, *spec.pool);
  }
  out.topk = index_topk(scores, reach, spec.index_topk);
  return out;
}

namespace {

// DSV41_REF_OP_TIMES=1: the wall time of every op call summed per op over the process (all threads:
// two reference sides add up) and printed on stderr at exit with the call counts. A rough profile
// of the reference for long runs (docs/scale.md); off by default (one getenv at first use).
class OpClock {
 public:
  static OpClock& get() {
    static OpClock clock;
    return clock;
  }
  const bool on = env_switch("DSV41_REF_OP_TIMES", false);
  void add(const char* op, double seconds) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto& [total, calls] = ops_[op];
    total += seconds;
    ++calls;
  }
  ~OpClock() {
    if (ops_.empty()) return;
    std::vector<std::pair<double, std::string>> rows;
    double all = 0;
    for (const auto& [op, tc] : ops_) {
      rows.emplace_back(tc.first, op);
      all += tc.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "reference op times (DSV41_REF_OP_TIMES, every thread): %.3f s\n", all);
    for (const auto& [sec, op] : rows) {
      std::fprintf(stderr, "  %-22s %9.3f s  %ld calls\n", op.c_str(), sec, static_cast<long>(ops_[op].second));
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::pair<double, int64_t>> ops_;
};

// Times the enclosing op call when DSV41_REF_OP_TIMES=1.
class OpTime {
 public:
  explicit OpTime(const char* op) : op_(op), on_(OpClock::get().on) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~OpTime() {
    if (on_) OpClock::get().add(op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  OpTime(const OpTime&) = delete;
  OpTime& operator=(const OpTime&) = delete;

 private:
  const char* op_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

class ReferenceOps final : public Ops {
 public:
  std::string name() const override { return "reference"; }

  Tensor<float> slice_rows(const Tensor<float>& x, int64_t first, int64_t count) const override {
    const OpTime time("slice_rows");
    return reference::slice_rows(x, first, count);
  }
  Tensor<uint8_t> slice_rows(const Tensor<uint8_t>& x, int64_t first, int64_t count) const override {
    const OpTime time("slice_rows");
    return reference::slice_rows(x, first, count);
  }
  Tensor<int32_t> slice_rows(const Tensor<int32_t>& x, int64_t first, int64_t count) const override {
    const OpTime time("slice_rows");
    return reference::slice_rows(x, first, count);
  }

  Tensor<float> embed(const std::vector<int64_t>& tokens, const Tensor<float>& table, int64_t hc) const override {
    const OpTime time("embed");
    return reference::embed(tokens, table, hc);
  }

  Tensor<float> linear(const Tensor<float>& x, const LinearWeight& w) const override {
    const OpTime time("linear");
    return reference::linear(x, w);
  }
  Tensor<float> linear_fp32(const Tensor<float>& x, const LinearWeight& w) const override {
    const OpTime time("linear_fp32");
    return reference::linear_fp32(x, w);
  }
  Tensor<float> grouped_linear(const Tensor<float>& x, const LinearWeight& w, int groups) const override {
    const OpTime time("grouped_linear");
    return reference::grouped_linear(x, w, groups);
  }

  Tensor<float> rms_norm(const Tensor<float>& x, const Tensor<float>& weight, double eps) const override {
    const OpTime time("rms_norm");
    return reference::rms_norm(x, weight.data(), eps);
  }

  void rope_rows(Tensor<float>& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t pos_stride,
                 bool inverse) const override {
    const OpTime time("rope_rows");
    reference::rope_rows(x, heads, rope, first_pos, pos_stride, inverse);
  }

  Tensor<float> qdq(formats::CacheFormat format, const Tensor<float>& x) const override {
    const OpTime time("qdq");
    return reference::qdq(format, x);
  }
  void write_entries(Tensor<uint8_t>& storage, formats::CacheFormat format, const std::vector<int64_t>& entries,
                     const Tensor<float>& rows) const override {
    const OpTime time("write_entries");
    reference::write_entries(storage, format, entries, rows);
  }
  Tensor<float> read_entries(const CacheRows& cache, const std::vector<int64_t>& entries) const override {
    const OpTime time("read_entries");
    return reference::read_entries(cache, entries);
  }

  Tensor<float> concat_kv_rows(const Tensor<float>& window, const Tensor<float>& compressed) const override {
    const OpTime time("concat_kv_rows");
    return reference::concat_kv_rows(window, compressed);
  }
  Tensor<int32_t> attention_index_rows(const Tensor<int32_t>& window, const Tensor<int32_t>& topk, int64_t offset,
                                       int64_t width) const override {
    const OpTime time("attention_index_rows");
    return reference::attention_index_rows(window, topk, offset, width);
  }
  Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& window_kv, const CacheRows& compressed,
                            const Tensor<float>& sink, const Tensor<int32_t>& idxs,
                            float softmax_scale) const override {
    const OpTime time("sparse_attn");
    if (compressed.count == 0) return reference::sparse_attn(q, window_kv, sink.data(), idxs, softmax_scale);
    // Only the compressed entries some index names, ascending, with the indices renumbered to them
    // (reference/ops/attention_rows.h: the same rows in the same order, the same bits); indices out of
    // range take the op on every entry, which names them in its error.
    const int64_t W = window_kv.rank() == 2 ? window_kv.dim(0) : 0;
    std::vector<int32_t> renumbered = idxs.data();
    if (attention_rows_in_range(renumbered, W, compressed.count)) {
      const std::vector<int64_t> used = compact_attention_rows(renumbered, W, compressed.count);
      const Tensor<float> kv = reference::concat_kv_rows(window_kv, reference::read_entries(compressed, used));
      return reference::sparse_attn(q, kv, sink.data(), Tensor<int32_t>(idxs.shape(), std::move(renumbered), idxs.name()),
                                    softmax_scale);
    }
    const Tensor<float> kv = reference::concat_kv_rows(window_kv, read_all_entries(compressed));
    return reference::sparse_attn(q, kv, sink.data(), idxs, softmax_scale);
  }

  CompressedLatents compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos, int ratio,
                             Tensor<float>& kv_state, Tensor<float>& score_state) const override {
    const OpTime time("compress");
    return reference::compress(kv, score, start_pos, ratio, kv_state, score_state);
  }

  Tensor<float> index_weights(const Tensor<float>& proj, int index_head_dim) const override {
    const OpTime time("index_weights");
    return reference::index_weights(proj, index_head_dim);
  }
  Tensor<float> index_scores(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& weights,
                             const std::vector<int64_t>& reach) const override {
    const OpTime time("index_scores");
    return reference::index_scores(q, read_all_entries(keys), weights, reach);
  }
  // The composition's outputs without its [T, N] score tensor (index_select_by_rows: rows scored in
  // tiles and selected by the worker that scored them; a layer inside the candidate pool scores only
  // the pool's keys, at most topk_blocks x block_size a query instead of every reachable key).
  IndexSelection index_select(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& weights,
                              const std::vector<int64_t>& reach, const IndexSelectSpec& spec) const override {
    const OpTime time("index_select");  // with the keys' dequantization, as index_scores
    return index_select_by_rows(q, read_all_entries(keys), weights, reach, spec);
  }
  Tensor<uint8_t> candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach, int topk_blocks,
                                   int block_size) const override {
    const OpTime time("candidate_blocks");
    return select_candidate_blocks(scores, reach, topk_blocks, block_size, /*owner_layer=*/-1).mask;
  }
  void mask_scores(Tensor<float>& scores, const Tensor<uint8_t>& mask) const override {
    const OpTime time("mask_scores");
    apply_score_mask(scores, mask);
  }
  Tensor<int32_t> index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach, int k) const override {
    const OpTime time("index_topk");
    return select_index_topk(scores, reach, k, /*offset=*/0, /*owner_layer=*/-1, /*ratio=*/1).idxs;
  }

  HcMixes hc_mixes(const Tensor<float>& stream, const HcWeights& w, double norm_eps, int iters,
                   double hc_eps) const override {
    const OpTime time("hc_mixes");
    return reference::hc_mixes(stream, w.fn.data(), w.scale.data(), w.base.data(), norm_eps, iters, hc_eps);
  }
  Tensor<float> hc_identity_pre(int64_t tokens, int64_t hc) const override {
    const OpTime time("hc_identity_pre");
    return reference::hc_identity_pre(tokens, hc);
  }
  Tensor<float> hc_pre(const Tensor<float>& stream, const Tensor<float>& pre) const override {
    const OpTime time("hc_pre");
    return reference::hc_pre(stream, pre);
  }
  Tensor<float> hc_post(const Tensor<float>& f, const Tensor<float>& residual, const Tensor<float>& post,
                        const Tensor<float>& comb) const override {
    const OpTime time("hc_post");
    return reference::hc_post(f, residual, post, comb);
  }

  Tensor<int64_t> engram_hash_ids(const EngramLayout& layout, int layer_index, const EngramHistory& history,
                                  int64_t start_pos, int64_t count) const override {
    const OpTime time("engram_hash_ids");
    return reference::engram_hash_ids(layout, layer_index, history, start_pos, count);
  }
  Tensor<float> engram_lookup(const EngramWeights& w, int head_dim, const Tensor<int64_t>& ids) const override {
    const OpTime time("engram_lookup");
    const EngramTableRef table = engram_table(w.table.data(), w.table_scale.data(), w.table.dim(0), head_dim);
    return reference::engram_lookup(table, ids);
  }
  Tensor<float> engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv, const EngramWeights& w,
                                     double eps) const override {
    const OpTime time("engram_gate_residual");
    return reference::engram_gate_residual(x, kv, w.q_weight.data(), w.k_weight.data(), eps);
  }

  MoeRouting moe_gate(const Tensor<float>& x, const MoeWeights& w, const ModelConfig& c, int layer) const override {
    const OpTime time("moe_gate");
    return reference::moe_gate(x, w, c, layer);
  }
  void moe_routing_weights(MoeRouting& r, const ModelConfig& c) const override {
    const OpTime time("moe_routing_weights");
    reference::moe_routing_weights(r, c);
  }
  Tensor<float> moe_experts(const Tensor<float>& x, const MoeWeights& w, const MoeRouting& routing,
                            const ModelConfig& c) const override {
    const OpTime time("moe_experts");
    return reference::moe_experts(x, w, routing, c);
  }

  Tensor<float> hc_mean(const Tensor<float>& stream) const override {
    const OpTime time("hc_mean");
    return reference::hc_mean(stream);
  }
  Tensor<float> concat_cols(const std::vector<Tensor<float>>& parts) const override {
    const OpTime time("concat_cols");
    return reference::concat_cols(parts);
  }
  Tensor<float> concat_rows(const std::vector<Tensor<float>>& parts) const override {
    const OpTime time("concat_rows");
    return reference::concat_rows(parts);
  }
  void add_markov_bias(Tensor<float>& logits, int64_t slot, const Tensor<float>& bias) const override {
    const OpTime time("add_markov_bias");
    reference::add_markov_bias(logits, slot, bias);
  }
};

}  // namespace

const Ops& reference_ops() {
  static const ReferenceOps ops;
  return ops;
}

}  // namespace dsv41::reference::seam
