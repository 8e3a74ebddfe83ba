// cuda/cuda_ops_indexer.cc
//
// CudaOps::index_weights and CudaOps::index_scores (cuda/indexer.cu kernels, BIT-EXACT:
// docs/cuda.md). The keys are the index-key cache entries 0 .. count - 1, unpacked on the device
// (CudaOps::read_entries, bit-exact) as the reference's read_all_entries does. Inputs the reference
// rejects (bad shapes, a reach outside [0, N]) run the reference on host copies, which raises its
// own error (a host call).
#include <numeric>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "reference/indexer.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {
const reference::Ops& ref() { return reference::reference_ops(); }
}  // namespace

Tensor<float> CudaOps::index_weights(const Tensor<float>& proj, int index_head_dim) const {
  if (!(proj.rank() == 2 && proj.dim(1) > 0 && index_head_dim > 0)) {  // the reference raises its error
    count("index_weights", false);
    return upload(ref().index_weights(host_copy(proj), index_head_dim));
  }
  count("index_weights", true);
  const float scale = reference::index_weight_scale(index_head_dim, static_cast<int>(proj.dim(1)));
  DevIn<float> p(proj);
  Tensor<float> w = device_tensor<float>(proj.shape(), "index_weights");
  gpu::index_weights(p.get(), proj.numel(), scale, dev(w));
  return w;
}

Tensor<float> CudaOps::index_scores(const Tensor<float>& q, const reference::CacheRows& keys,
                                    const Tensor<float>& weights, const std::vector<int64_t>& reach) const {
  const auto host = [&] {
    count("index_scores", false);
    const Tensor<uint8_t> bytes = keys.bytes ? host_copy(*keys.bytes) : Tensor<uint8_t>();
    reference::CacheRows k = keys;
    k.bytes = keys.bytes ? &bytes : nullptr;
    return upload(ref().index_scores(host_copy(q), k, host_copy(weights), reach));
  };
  if (!(q.rank() == 3 && weights.rank() == 2 && keys.count >= 0)) return host();
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2), n = keys.count;
  bool ok = keys.dim == d && weights.dim(0) == T && weights.dim(1) == heads &&
            static_cast<int64_t>(reach.size()) == T;
  for (int64_t r : reach) ok = ok && r >= 0 && r <= n;
  if (!ok) return host();
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  const Tensor<float> rows = read_entries(keys, all);  // [n, d] on the device (read_all_entries)
  count("index_scores", true);
  Tensor<float> scores = device_tensor<float>({T, n}, "index_score");
  if (T * n == 0) return scores;
  DevIn<float> dq(q), dk(rows), dw(weights);
  const auto dr = to_device(reach);
  gpu::index_scores(dq.get(), dk.get(), dw.get(), dr->get(), T, heads, d, n, dev(scores));
  return scores;
}

}  // namespace dsv41::gpu
