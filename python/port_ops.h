// python/port_ops.h
//
// PortOps: a port's own ops, written in Python (torch, numpy), behind the ops seam
// (reference/seam/ops.h), as docs/architecture.md "Adding a backend" describes: every method runs the
// CPU reference except the ones the port gives, so dsv41.Model(config, weights, port={...}) runs
// the reference model's orchestration (chunks, caches, ownership, sessions) on the port's
// components, and its dump is judged by `dsv41 conform` like any port's.
//
// The callables (docs/python.md, "A port's ops in the reference model"), each called with the
// running layer (scenarios/defects/bug_zoo_forwarding.h: the layer of the latest RoPE call) and keyword
// arguments, numpy arrays in the reference's shapes and dtypes:
//   index_scores(layer, q f32 [T, Hi, Di], keys u8 [count, entry_bytes], keys_format, keys_dim,
//                weights f32 [T, Hi], reach i64 [T])                          -> f32 [T, count]
//   candidate_blocks(layer, scores f32 [T, N], reach i64 [T], topk_blocks, block_size) -> u8 [T, N]
//   mask_scores(layer, scores f32 [T, N], mask u8 [T, N])                       -> f32 [T, N]
//   index_topk(layer, scores f32 [T, N], reach i64 [T], k)                      -> i32 [T, min(k, N)]
//   compress(layer, kv f32 [T, D], score f32 [T, D], start_pos, ratio, kv_state f32 [ratio, D],
//            score_state f32 [ratio, D])  -> (first_group, latent f32 [n, D], kv_state, score_state)
//   sparse_attn(layer, q f32 [T, H, D], window_kv f32 [W, D], compressed u8 [count, entry_bytes],
//               compressed_format, compressed_dim, sink f32 [H], idxs i32 [T, K],
//               softmax_scale)                                                 -> f32 [T, H, D]
// A returned array of another shape or dtype is a dsv41.Error naming the op and the layer; an
// exception raised by a callable propagates unchanged. The model runs with the GIL released; each
// call takes it back.
#pragma once

#include <pybind11/pybind11.h>

#include <set>
#include <string>

#include "python/bindings.h"
#include "reference/seam/forwarding_ops.h"

namespace dsv41::python {

class __attribute__((visibility("hidden"))) PortOps : public reference::seam::ForwardingOps {
 public:
  // The op names a port may give (the others are the reference's).
  static const std::set<std::string>& supported();

  explicit PortOps(py::dict fns);
  ~PortOps() override;
  std::string name() const override { return "python-port"; }

  reference::Tensor<float> index_scores(const reference::Tensor<float>& q, const reference::CacheRows& keys,
                                        const reference::Tensor<float>& weights,
                                        const std::vector<int64_t>& reach) const override;
  reference::Tensor<uint8_t> candidate_blocks(const reference::Tensor<float>& scores, const std::vector<int64_t>& reach,
                                              int topk_blocks, int block_size) const override;
  void mask_scores(reference::Tensor<float>& scores, const reference::Tensor<uint8_t>& mask) const override;
  reference::Tensor<int32_t> index_topk(const reference::Tensor<float>& scores, const std::vector<int64_t>& reach,
                                        int k) const override;
  reference::CompressedLatents compress(const reference::Tensor<float>& kv, const reference::Tensor<float>& score,
                                        int64_t start_pos, int ratio, reference::Tensor<float>& kv_state,
                                        reference::Tensor<float>& score_state) const override;
  reference::Tensor<float> sparse_attn(const reference::Tensor<float>& q, const reference::Tensor<float>& window_kv,
                                       const reference::CacheRows& compressed, const reference::Tensor<float>& sink,
                                       const reference::Tensor<int32_t>& idxs, float softmax_scale) const override;

 private:
  // The callable of `op`, or nullptr (the reference's).
  PyObject* fn(const char* op) const;
  py::dict fns_;
};

}  // namespace dsv41::python
