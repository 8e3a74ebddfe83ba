// cuda/cuda_ops.h
//
// CudaOps: the CUDA path behind the ops seam (reference/seam/ops.h), in one of two modes:
//   CudaMode::kExact       backend "cuda-exact": every ported op bit-exact (the GPU twin of the
//                          reference; docs/cuda.md "What runs where")
//   CudaMode::kProduction  backend "cuda": production kernels (tensor cores, their own summation
//                          order: claim order-variant) replace the exact ones op by op
//                          (production_ops()); every other op is the exact kernel.
// Host header:
// no CUDA types (library dsv41_cuda_ops, built only when nvcc is found: DSV41_HAVE_CUDA).
//
// Tensors produced by these ops live in device memory (a CudaStorage, cuda/device_tensor.h:
// cudaMalloc'd, clone = device-to-device copy); upload/download move them. An op given a host
// tensor uploads a temporary copy, so every method also works on host inputs (tests do that).
// Weights stay host memory in ModelWeights; prepare() mirrors them (and the RoPE tables) to the
// device once, and the ops find a mirror again by the host address of its values; release()
// (the Model's destructor) forgets them, so a later allocation at the same address is never
// taken for a prepared weight. A weight an op meets that prepare() did not register (a test's
// own weight, a copied Model's) is uploaded for that call only: never cached by address.
//
// Ported ops run as kernels (cuda/<component>.cu ↔ reference/ops/<component>.cc); the others run
// through an EXPLICIT host fallback (download inputs, call reference_ops(), upload outputs),
// counted per call, so a report states exactly which ops ran on the GPU:
//   ported()         names of the ops with a kernel (some are hybrids: kernels plus the
//                    reference's glibc exp/log steps on small downloaded tensors, docs/cuda.md)
//   host_fallbacks() names of the ops that always fall back
//   counts()         per op name: calls on the GPU and calls through the host fallback
//   DSV41_CUDA_OP_TIMES=1  a rough time profile per op, printed on stderr when the ops end
//                    (the device synchronized at every op: slower, for finding where time goes)
// An input the reference rejects (a non-bf16 linear input, a non-finite cache row) is detected on
// the device; the op then re-runs the reference on the host, which raises its exact error.
// DSV41_CUDA_DEFER_CHECKS=1 (cuda/deferred_checks.h): such a check whose failure can only be an
// error is not read back (no synchronization); it is resolved at the next download / host copy
// (every forward ends with one: the logits), which then throws naming the op and the thing.
// docs/cuda.md lists which ported ops are bit-exact (all of them in kExact) and why, and the production ops.
//
// Example:
//   if (gpu::device_count() == 0) ...;                     // CudaOps needs a device (ctor throws)
//   gpu::CudaOps ops;
//   reference::model::Model m(config, weights, token_map, ops);   // the whole forward on CudaOps
//   for (auto& [op, n] : ops.counts()) printf("%s gpu %ld host %ld\n", op.c_str(), n.gpu, n.host);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "reference/seam/ops.h"

namespace dsv41::gpu {

enum class CudaMode { kExact, kProduction };

struct OpCalls {
  int64_t gpu = 0;   // calls that ran as kernels
  int64_t host = 0;  // calls through the host fallback
};

class CudaOps final : public reference::seam::Ops {
 public:
  // Throws dsv41::Error("no CUDA device ...") when there is none.
  explicit CudaOps(CudaMode mode = CudaMode::kExact);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  std::string name() const override { return mode_ == CudaMode::kExact ? "cuda-exact" : "cuda"; }
  CudaMode mode() const { return mode_; }

  static std::vector<std::string> ported();
  // The ops kProduction runs on production (order-variant) kernels, with the inputs they cover
  // ("linear F8": F8_E4M3 weights, not linear_fp32; "sparse_attn"; "indexer": index_select on the
  // FP4 index-key cache); docs/cuda.md "Production ops".
  // DSV41_CUDA_PRODUCTION_OPS=<comma list of op names: linear, sparse_attn, indexer; all (default); none>
  // picks which of them kProduction runs (each judged alone: the others stay exact kernels); "all"
  // leaves out opt_in_ops() (none now: an op not yet run on a device would be listed there).
  static std::vector<std::string> production_ops();
  // Production ops that "all" (the default) leaves off: on only where the list names them.
  static const std::vector<std::string>& opt_in_ops();
  // Whether this backend runs the production kernel of `op` ("linear", "sparse_attn", "indexer").
  bool production(const char* op) const;
  static std::vector<std::string> host_fallbacks();
  std::map<std::string, OpCalls> counts() const;
  void reset_counts() const;
  // DSV41_CUDA_OP_TIMES=1: synchronizes, charges the time since the last mark to the op marked
  // then, and marks `op` (an op whose count() comes after its launches marks its start with it;
  // the scenario backend marks "(outside the forward)" after each forward). Otherwise nothing.
  void time_mark(const char* op) const;
  // Whether this backend defers its input checks: DSV41_CUDA_DEFER_CHECKS (read once per process)
  // at construction; set_defer_checks (tests) resolves what is pending, then switches.
  bool defers_checks() const;
  void set_defer_checks(bool on) const;
  // Resolves the pending deferred checks now (one synchronization when any is pending): throws a
  // dsv41::Error naming the first that failed. download() and host copies do this on their own.
  void resolve_checks() const;

  // ---- memory ----
  void prepare(const reference::checkpoint::ModelWeights& weights, const std::vector<reference::RopeTable>& rope) const override;
  void release(const reference::checkpoint::ModelWeights& weights, const std::vector<reference::RopeTable>& rope) const override;
  reference::Tensor<float> upload(reference::Tensor<float> host) const override;
  reference::Tensor<int32_t> upload(reference::Tensor<int32_t> host) const override;
  reference::Tensor<int64_t> upload(reference::Tensor<int64_t> host) const override;
  reference::Tensor<uint8_t> upload(reference::Tensor<uint8_t> host) const override;
  reference::Tensor<float> download(reference::Tensor<float> t) const override;
  reference::Tensor<int32_t> download(reference::Tensor<int32_t> t) const override;
  reference::Tensor<int64_t> download(reference::Tensor<int64_t> t) const override;
  reference::Tensor<uint8_t> download(reference::Tensor<uint8_t> t) const override;
  reference::Tensor<float> slice_rows(const reference::Tensor<float>& x, int64_t first, int64_t count_) const override;
  reference::Tensor<uint8_t> slice_rows(const reference::Tensor<uint8_t>& x, int64_t first,
                                        int64_t count_) const override;
  reference::Tensor<int32_t> slice_rows(const reference::Tensor<int32_t>& x, int64_t first,
                                        int64_t count_) const override;

  // ---- ported (kernels) ----
  reference::Tensor<float> embed(const std::vector<int64_t>& tokens, const reference::Tensor<float>& table,
                                 int64_t hc) const override;
  reference::Tensor<float> linear(const reference::Tensor<float>& x, const reference::LinearWeight& w) const override;
  reference::Tensor<float> linear_fp32(const reference::Tensor<float>& x,
                                       const reference::LinearWeight& w) const override;
  reference::Tensor<float> grouped_linear(const reference::Tensor<float>& x, const reference::LinearWeight& w,
                                          int groups) const override;
  reference::Tensor<float> rms_norm(const reference::Tensor<float>& x, const reference::Tensor<float>& weight,
                                    double eps) const override;
  void rope_rows(reference::Tensor<float>& x, int64_t heads, const reference::RopeTable& rope, int64_t first_pos,
                 int64_t pos_stride, bool inverse) const override;
  reference::Tensor<float> qdq(formats::CacheFormat format, const reference::Tensor<float>& x) const override;
  void write_entries(reference::Tensor<uint8_t>& storage, formats::CacheFormat format,
                     const std::vector<int64_t>& entries, const reference::Tensor<float>& rows) const override;
  reference::Tensor<float> read_entries(const reference::CacheRows& cache,
                                        const std::vector<int64_t>& entries) const override;
  reference::Tensor<float> concat_kv_rows(const reference::Tensor<float>& window,
                                          const reference::Tensor<float>& compressed) const override;
  reference::Tensor<float> hc_identity_pre(int64_t tokens, int64_t hc) const override;
  reference::Tensor<float> hc_pre(const reference::Tensor<float>& stream,
                                  const reference::Tensor<float>& pre) const override;
  reference::Tensor<float> hc_post(const reference::Tensor<float>& f, const reference::Tensor<float>& residual,
                                   const reference::Tensor<float>& post,
                                   const reference::Tensor<float>& comb) const override;
  reference::Tensor<float> hc_mean(const reference::Tensor<float>& stream) const override;
  reference::Tensor<float> concat_cols(const std::vector<reference::Tensor<float>>& parts) const override;
  reference::Tensor<float> concat_rows(const std::vector<reference::Tensor<float>>& parts) const override;
  void add_markov_bias(reference::Tensor<float>& logits, int64_t slot,
                       const reference::Tensor<float>& bias) const override;

  // ---- host fallbacks (cuda/cuda_fallback.cc) ----
  reference::Tensor<int32_t> attention_index_rows(const reference::Tensor<int32_t>& window,
                                                  const reference::Tensor<int32_t>& topk, int64_t offset,
                                                  int64_t width) const override;
  reference::Tensor<float> sparse_attn(const reference::Tensor<float>& q, const reference::Tensor<float>& window_kv,
                                       const reference::CacheRows& compressed, const reference::Tensor<float>& sink,
                                       const reference::Tensor<int32_t>& idxs, float softmax_scale) const override;
  reference::CompressedLatents compress(const reference::Tensor<float>& kv, const reference::Tensor<float>& score,
                                        int64_t start_pos, int ratio, reference::Tensor<float>& kv_state,
                                        reference::Tensor<float>& score_state) const override;
  reference::Tensor<float> index_weights(const reference::Tensor<float>& proj, int index_head_dim) const override;
  reference::Tensor<float> index_scores(const reference::Tensor<float>& q, const reference::CacheRows& keys,
                                        const reference::Tensor<float>& weights,
                                        const std::vector<int64_t>& reach) const override;
  reference::Tensor<uint8_t> candidate_blocks(const reference::Tensor<float>& scores,
                                              const std::vector<int64_t>& reach, int topk_blocks,
                                              int block_size) const override;
  void mask_scores(reference::Tensor<float>& scores, const reference::Tensor<uint8_t>& mask) const override;
  reference::Tensor<int32_t> index_topk(const reference::Tensor<float>& scores, const std::vector<int64_t>& reach,
                                        int k) const override;
  // kProduction with "indexer" on: the fused production kernel (cuda/index_select.h) where it
  // covers the inputs; otherwise (and in kExact) the seam's default composition of the ops above.
  reference::IndexSelection index_select(const reference::Tensor<float>& q, const reference::CacheRows& keys,
                                         const reference::Tensor<float>& weights, const std::vector<int64_t>& reach,
                                         const reference::IndexSelectSpec& spec) const override;
  reference::HcMixes hc_mixes(const reference::Tensor<float>& stream, const reference::HcWeights& w, double norm_eps,
                              int iters, double hc_eps) const override;
  reference::Tensor<int64_t> engram_hash_ids(const reference::EngramLayout& layout, int layer_index,
                                             const reference::EngramHistory& history, int64_t start_pos,
                                             int64_t count_) const override;
  reference::Tensor<float> engram_lookup(const reference::EngramWeights& w, int head_dim,
                                         const reference::Tensor<int64_t>& ids) const override;
  reference::Tensor<float> engram_gate_residual(const reference::Tensor<float>& x, const reference::Tensor<float>& kv,
                                                const reference::EngramWeights& w, double eps) const override;
  reference::MoeRouting moe_gate(const reference::Tensor<float>& x, const reference::MoeWeights& w,
                                 const reference::ModelConfig& c, int layer) const override;
  void moe_routing_weights(reference::MoeRouting& r, const reference::ModelConfig& c) const override;
  reference::Tensor<float> moe_experts(const reference::Tensor<float>& x, const reference::MoeWeights& w,
                                       const reference::MoeRouting& routing,
                                       const reference::ModelConfig& c) const override;

 private:
  struct State;
  // The device copy of n host values: the registered mirror when prepare() registered exactly
  // these (address and size), else a copy uploaded for this call, freed with the Mirror.
  template <typename T>
  class MirrorOf {
   public:
    const T* get() const { return p_; }
   private:
    friend class CudaOps;
    const T* p_ = nullptr;
    std::unique_ptr<DeviceBuffer<T>> temp_;
  };
  using Mirror = MirrorOf<float>;
  Mirror mirror(const float* host, size_t n) const;
  Mirror mirror(const std::vector<float>& host) const { return mirror(host.data(), host.size()); }
  // The same for byte arrays (the Engram fp8 tables), kept in a map of their own.
  MirrorOf<uint8_t> mirror(const std::vector<uint8_t>& host) const;
  // prepare(): copies n host values to the device under their address (again if known).
  void register_mirror(const float* host, size_t n) const;
  void register_mirror(const uint8_t* host, size_t n) const;
  void count(const char* op, bool on_gpu) const;  // also time_mark(op)
  // With deferred checks on: a zeroed device int for a check of `what` (the op, the thing, what a
  // set flag means), resolved at the next synchronizing call; nullptr when off (the op reads its
  // own status back). `what` is built only when on.
  template <typename F>
  int* deferred_check(F&& what) const {
    return defers_checks() ? check_slot(what()) : nullptr;
  }
  int* check_slot(std::string what) const;
  // Around a synchronizing copy: stage_checks() copies the pending flags asynchronously before it,
  // settle_checks(n) reads them after it and throws for a set one (cuda/deferred_checks.h).
  int stage_checks() const;
  void settle_checks(int staged) const;
  // The host copy of a tensor wherever it lives (no device clone).
  template <typename T>
  reference::Tensor<T> host_copy(const reference::Tensor<T>& t) const;
  reference::Tensor<float> linear_path(const char* op, const reference::Tensor<float>& x,
                                       const reference::LinearWeight& w, bool fp32) const;

  // The production linear (cuda/linear_fp8_mma.cu): the weight's E4M3 codes, kept per prepared
  // weight (forgotten by release()), or this call's when the weight was not prepared.
  MirrorOf<uint8_t> e4m3_codes(const reference::LinearWeight& w, const float* device_values) const;

  CudaMode mode_;
  std::unique_ptr<State> s_;
};

}  // namespace dsv41::gpu
