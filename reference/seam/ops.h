// reference/seam/ops.h
//
// Ops: the seam between the model and its components. The model (reference/model/model.h: chunks,
// caches, ownership, published selections, bounded replay, hooks) is written once and reaches
// every component through this one table; each backend implements the table under the same names
// (docs/architecture.md):
//
//   reference_ops()   the CPU reference: each method calls the component function of the same
//                     name in reference/ops/<component>.h (the spec, bit-exact, readable)
//   cuda              dsv41::gpu, cuda/<component>.cu, whose tensors live in device memory
//
// Contract of every method:
//   - tensors in, tensors out; no model state, no hooks, no files. State an op updates (a cache's
//     storage, the compressor's partial group) is passed in explicitly.
//   - tensors may live in the backend's memory (reference/ops/tensor.h DeviceStorage): the model
//     never reads a tensor's values itself, so a device backend runs a whole step without a host
//     round trip; the model calls download() only to show a value to a hook, to hand a step's
//     record (logits, selections) or a draft's result to its caller, and to sample a draft token
//     (the sampler and its seeded generator run on the host, reference/ops/sampling.h), and upload()
//     for what it computes on the host (token ids, window and DSpark index rows, hook
//     replacements).
//   - shapes, dtypes and rounding are those of the reference function of the same name: a
//     backend that claims the reference's bits must give them; one that does not is compared
//     with tolerances by the scenario runner.
//   - host metadata (positions, counts, reach, entry numbers, config) is passed as plain values.
//   - methods are const and may run concurrently on different tensors.
//
// Weights: ModelWeights is host memory, every tensor named by its checkpoint name (a
// LinearWeight by its prefix). prepare() is called once per Model; a device backend mirrors the
// weights there and finds them again by name.
//
// Example (a backend that counts calls, as tests/reference/seam/ops_seam_test.cc does):
//   class Counting : public Ops { ... Tensor<float> rms_norm(...) const override { ++n; return
//                                 reference_ops().rms_norm(...); } ... };
//   Model m(config, weights, token_map, counting);    // the whole forward runs through it
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "reference/ops/attention.h"
#include "reference/ops/compressor.h"
#include "reference/ops/config.h"
#include "reference/ops/dspark.h"
#include "reference/ops/embedding.h"
#include "reference/ops/engram.h"
#include "reference/ops/indexer.h"
#include "reference/ops/kv_quant.h"
#include "reference/ops/linear.h"
#include "reference/ops/mhc.h"
#include "reference/ops/moe.h"
#include "reference/ops/rmsnorm.h"
#include "reference/ops/rope.h"
#include "reference/ops/tensor.h"
#include "reference/checkpoint/weights.h"

namespace dsv41::reference::seam {

class Ops {
 public:
  virtual ~Ops() = default;

  // "reference", "cuda", ...: names the backend in messages and reports.
  virtual std::string name() const = 0;

  // ---- memory (reference/ops/tensor.h) ----
  // Called once by each Model built on these ops, with its weights and RoPE tables (one per
  // layer), which outlive the Model; the reference needs nothing.
  virtual void prepare(const checkpoint::ModelWeights& weights, const std::vector<RopeTable>& rope) const;
  // Called by the Model's destructor with the same arguments: a device backend forgets what it
  // mirrored (a later allocation at the same address is another array). The reference: nothing.
  virtual void release(const checkpoint::ModelWeights& weights, const std::vector<RopeTable>& rope) const;
  // A host tensor into this backend's memory, and back (the reference: both are the identity).
  virtual Tensor<float> upload(Tensor<float> host) const;
  virtual Tensor<int32_t> upload(Tensor<int32_t> host) const;
  virtual Tensor<int64_t> upload(Tensor<int64_t> host) const;
  virtual Tensor<uint8_t> upload(Tensor<uint8_t> host) const;
  virtual Tensor<float> download(Tensor<float> t) const;
  virtual Tensor<int32_t> download(Tensor<int32_t> t) const;
  virtual Tensor<int64_t> download(Tensor<int64_t> t) const;
  virtual Tensor<uint8_t> download(Tensor<uint8_t> t) const;
  // Rows [first, first + count) of x along its first dimension (decoder replay keeps a tail).
  virtual Tensor<float> slice_rows(const Tensor<float>& x, int64_t first, int64_t count) const = 0;
  virtual Tensor<uint8_t> slice_rows(const Tensor<uint8_t>& x, int64_t first, int64_t count) const = 0;
  virtual Tensor<int32_t> slice_rows(const Tensor<int32_t>& x, int64_t first, int64_t count) const = 0;

  // ---- embedding.h ----
  virtual Tensor<float> embed(const std::vector<int64_t>& tokens, const Tensor<float>& table, int64_t hc) const = 0;

  // ---- linear.h ----
  virtual Tensor<float> linear(const Tensor<float>& x, const LinearWeight& w) const = 0;
  virtual Tensor<float> linear_fp32(const Tensor<float>& x, const LinearWeight& w) const = 0;
  virtual Tensor<float> grouped_linear(const Tensor<float>& x, const LinearWeight& w, int groups) const = 0;

  // ---- rmsnorm.h ----
  virtual Tensor<float> rms_norm(const Tensor<float>& x, const Tensor<float>& weight, double eps) const = 0;

  // ---- rope.h (in place) ----
  virtual void rope_rows(Tensor<float>& x, int64_t heads, const RopeTable& rope, int64_t first_pos,
                         int64_t pos_stride, bool inverse) const = 0;

  // ---- kv_quant.h: the cache formats ----
  virtual Tensor<float> qdq(formats::CacheFormat format, const Tensor<float>& x) const = 0;
  virtual void write_entries(Tensor<uint8_t>& storage, formats::CacheFormat format,
                             const std::vector<int64_t>& entries, const Tensor<float>& rows) const = 0;
  virtual Tensor<float> read_entries(const CacheRows& cache, const std::vector<int64_t>& entries) const = 0;

  // ---- attention.h ----
  // Window KV rows then compressed KV rows, as sparse_attn reads them.
  virtual Tensor<float> concat_kv_rows(const Tensor<float>& window, const Tensor<float>& compressed) const = 0;
  virtual Tensor<int32_t> attention_index_rows(const Tensor<int32_t>& window, const Tensor<int32_t>& topk,
                                               int64_t offset, int64_t width) const = 0;
  // sparse_attn over [window_kv rows | the compressed cache's entries]: an index < window_kv.dim(0)
  // is a window row, a larger one the compressed entry (index - window_kv.dim(0)). (The
  // reference dequantizes the cache and concatenates; a fused kernel reads the entries.)
  virtual Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& window_kv, const CacheRows& compressed,
                                    const Tensor<float>& sink, const Tensor<int32_t>& idxs,
                                    float softmax_scale) const = 0;

  // ---- compressor.h (the state tensors are updated in place) ----
  virtual CompressedLatents compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos,
                                     int ratio, Tensor<float>& kv_state, Tensor<float>& score_state) const = 0;

  // ---- indexer.h ----
  virtual Tensor<float> index_weights(const Tensor<float>& proj, int index_head_dim) const = 0;
  // Scores against the first keys.count entries of the index_keys cache.
  virtual Tensor<float> index_scores(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& weights,
                                     const std::vector<int64_t>& reach) const = 0;
  // The candidate source's position mask [T, N] (select_candidate_blocks(...).mask).
  virtual Tensor<uint8_t> candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                           int topk_blocks, int block_size) const = 0;
  // scores = -inf where mask == 0 (apply_candidate_mask without the owner check: the model checks).
  virtual void mask_scores(Tensor<float>& scores, const Tensor<uint8_t>& mask) const = 0;
  // The top-k compressed positions [T, min(k, N)], ascending, -1 where unreachable
  // (select_index_topk(...) with offset 0).
  virtual Tensor<int32_t> index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                     int k) const = 0;
  // The whole selection of one index layer in one call (the hierarchy of docs/indexer.md: scores
  // from the packed index-key cache, the candidate pool, block maxima, the top-k), for a step
  // whose hooks do not capture index_scores. Its default, here, is EXACTLY the composition the
  // model otherwise calls, through this table's own virtual methods (so a table that overrides
  // index_scores or index_topk changes the fused op too):
  //   scores = index_scores(q, keys, weights, reach)
  //   spec.candidate_topk_blocks > 0: candidates = candidate_blocks(scores, reach, blocks, size)
  //   spec.pool:                      mask_scores(scores, *spec.pool)
  //   topk = index_topk(scores, reach, spec.index_topk)
  // A backend may fuse it (no [T, N] score matrix; cuda's production kernel, docs/cuda.md): the
  // scores then never leave it, so its selection is judged as a set with the tie band.
  virtual IndexSelection index_select(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& weights,
                                      const std::vector<int64_t>& reach, const IndexSelectSpec& spec) const;

  // ---- mhc.h ----
  virtual HcMixes hc_mixes(const Tensor<float>& stream, const HcWeights& w, double norm_eps, int iters,
                           double hc_eps) const = 0;
  virtual Tensor<float> hc_identity_pre(int64_t tokens, int64_t hc) const = 0;
  virtual Tensor<float> hc_pre(const Tensor<float>& stream, const Tensor<float>& pre) const = 0;
  virtual Tensor<float> hc_post(const Tensor<float>& f, const Tensor<float>& residual, const Tensor<float>& post,
                                const Tensor<float>& comb) const = 0;

  // ---- engram.h ----
  // Computed from the host history (token ids): the result is uploaded to the backend.
  virtual Tensor<int64_t> engram_hash_ids(const EngramLayout& layout, int layer_index, const EngramHistory& history,
                                          int64_t start_pos, int64_t count) const = 0;
  virtual Tensor<float> engram_lookup(const EngramWeights& w, int head_dim, const Tensor<int64_t>& ids) const = 0;
  virtual Tensor<float> engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv,
                                             const EngramWeights& w, double eps) const = 0;

  // ---- moe.h ----
  virtual MoeRouting moe_gate(const Tensor<float>& x, const MoeWeights& w, const ModelConfig& c, int layer) const = 0;
  virtual void moe_routing_weights(MoeRouting& r, const ModelConfig& c) const = 0;
  virtual Tensor<float> moe_experts(const Tensor<float>& x, const MoeWeights& w, const MoeRouting& routing,
                                    const ModelConfig& c) const = 0;

  // ---- dspark.h (the DSpark draft head; its other steps are the components above) ----
  virtual Tensor<float> hc_mean(const Tensor<float>& stream) const = 0;
  virtual Tensor<float> concat_cols(const std::vector<Tensor<float>>& parts) const = 0;
  virtual Tensor<float> concat_rows(const std::vector<Tensor<float>>& parts) const = 0;
  // logits[slot] += bias, in place (the Markov chain's bias of one draft slot).
  virtual void add_markov_bias(Tensor<float>& logits, int64_t slot, const Tensor<float>& bias) const = 0;
};

// The CPU reference's ops (one instance; stateless).
const Ops& reference_ops();

}  // namespace dsv41::reference::seam
