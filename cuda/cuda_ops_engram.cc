// cuda/cuda_ops_engram.cc
//
// CudaOps::engram_lookup and CudaOps::engram_gate_residual (cuda/engram.cu kernels, BIT-EXACT:
// docs/cuda.md). engram_hash_ids stays on the host by design (it reads the host token history).
// The tables (bytes) and the q/k weights are prepared mirrors (CudaOps::prepare); a table an op
// meets unprepared is copied for that call only. Inputs the reference rejects (bad shapes, an id
// outside the table) run the reference on host copies, which raises its own error (a host call).
#include <cmath>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "reference/ops/engram.h"
#include "reference/ops/rmsnorm.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {
const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }
}  // namespace

Tensor<float> CudaOps::engram_lookup(const reference::EngramWeights& w, int head_dim,
                                     const Tensor<int64_t>& ids) const {
  const auto host = [&] {
    count("engram_lookup", false);
    return upload(ref().engram_lookup(w, head_dim, host_copy(ids)));
  };
  const int64_t rows = w.table.rank() >= 1 ? w.table.dim(0) : 0, hd = head_dim;
  const bool table_ok = rows > 0 && hd > 0 && hd % 32 == 0 && w.table.numel() == rows * hd &&
                        w.table_scale.numel() == rows * (hd / 32) && w.table.on_host() && w.table_scale.on_host();
  if (!table_ok || ids.rank() != 2) return host();
  const Tensor<int64_t> hids = host_copy(ids);  // [T, n_cols]: small
  for (int64_t id : hids.data()) {
    if (id < 0 || id >= rows) return host();
  }
  count("engram_lookup", true);
  const int64_t T = ids.dim(0), cols = ids.dim(1);
  Tensor<float> out = device_tensor<float>({T, cols * hd}, "engram_rows");
  if (T * cols == 0) return out;
  const MirrorOf<uint8_t> codes = mirror(w.table.data()), scales = mirror(w.table_scale.data());
  DevIn<int64_t> di(ids);
  gpu::engram_lookup(codes.get(), scales.get(), hd, di.get(), T, cols, dev(out));
  return out;
}

Tensor<float> CudaOps::engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv,
                                            const reference::EngramWeights& w, double eps) const {
  const int64_t T = x.rank() == 3 ? x.dim(0) : 0, hc = x.rank() == 3 ? x.dim(1) : 0,
                dim = x.rank() == 3 ? x.dim(2) : 0;
  const bool ok = x.rank() == 3 && dim >= 1 && dim < reference::kTorchSerialSumLimit && kv.rank() == 2 && kv.dim(0) == T &&
                  kv.dim(1) == (hc + 1) * dim && w.q_weight.numel() == hc * dim && w.k_weight.numel() == hc * dim &&
                  w.q_weight.on_host() && w.k_weight.on_host();
  if (!ok) {  // the reference raises its error (or handles the shape its own way)
    count("engram_gate_residual", false);
    return upload(ref().engram_gate_residual(host_copy(x), host_copy(kv), w, eps));
  }
  count("engram_gate_residual", true);
  Tensor<float> out = device_tensor<float>({T, hc, dim}, "engram_out");
  if (T * hc == 0) return out;
  // fp32(dim^-0.5) as the reference computes it (std::pow in double, one rounding).
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  DevIn<float> dx(x), dkv(kv);
  const Mirror q = mirror(w.q_weight.data()), k = mirror(w.k_weight.data());
  DeviceBuffer<float> gates(static_cast<size_t>(T * hc));
  gpu::engram_gate_residual(dx.get(), dkv.get(), q.get(), k.get(), T, hc, dim, eps, inv_sqrt_dim, gates.get(),
                            dev(out));
  return out;
}

}  // namespace dsv41::gpu
