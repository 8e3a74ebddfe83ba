// cuda/cuda_fallback.cc
//
// The ops of CudaOps that run on the host by design: each is an EXPLICIT host fallback, counted per call
// (CudaOps::counts), that downloads its inputs, calls the reference op (reference_ops()) and
// uploads its outputs. Bit-exact by construction (it IS the reference), and slow: every call is
// a device round trip (docs/cuda.md says why these two stay on the host).
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {
const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }
}  // namespace

Tensor<int64_t> CudaOps::engram_hash_ids(const reference::EngramLayout& layout, int layer_index,
                                         const reference::EngramHistory& history, int64_t start_pos,
                                         int64_t count_) const {
  count("engram_hash_ids", false);  // computed from the host history by design (reference/seam/ops.h)
  return upload(ref().engram_hash_ids(layout, layer_index, history, start_pos, count_));
}

void CudaOps::moe_routing_weights(reference::MoeRouting& r, const reference::ModelConfig& c) const {
  count("moe_routing_weights", false);
  reference::MoeRouting h{host_copy(r.experts), host_copy(r.weights), host_copy(r.scores)};
  ref().moe_routing_weights(h, c);
  r.experts = upload(std::move(h.experts));
  r.weights = upload(std::move(h.weights));
  r.scores = upload(std::move(h.scores));
}

}  // namespace dsv41::gpu
