// cuda/cuda_ops_compressor.cc
//
// CudaOps::compress (reference/ops/compressor.h) on the device: the pooling kernel and the state
// update of cuda/compressor.cu, the state tensors resident on the device (the Model uploads them,
// reference/model/model.cc). BIT-EXACT: the kernel's exp is libm_expf, glibc's expf rebuilt from
// correctly rounded binary64 steps (cuda/libm_expf.h). Host fallback (the reference op on host
// copies, counted as a host call) when the reference would reject the call (it raises its own
// error), when the state lives on the host, or when this process's std::exp is not the libm
// libm_expf reproduces (libm_expf_matches_host).
#include <algorithm>
#include <cmath>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"

namespace dsv41::gpu {

using reference::Tensor;

bool libm_expf_matches_host() {
  static const bool matches = [] {
    // The input where glibc's FMA and non-FMA builds differ (tests/cuda/libm_expf_test.cc), the
    // first input where glibc's expf is not correctly rounded (docs/cuda.md), and every 65,521st
    // bit pattern of the float line (NaNs compared as NaN).
    std::vector<uint32_t> probe = {0x4202422fu, f32_bits(0x1.fefe02p-16f)};
    for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) probe.push_back(static_cast<uint32_t>(u));
    for (uint32_t u : probe) {
      const float x = f32_from_bits(u), a = std::exp(x), b = libm_expf(x);
      if (std::isnan(a) ? !std::isnan(b) : f32_bits(a) != f32_bits(b)) return false;
    }
    return true;
  }();
  return matches;
}

reference::CompressedLatents CudaOps::compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos,
                                               int ratio, Tensor<float>& kv_state, Tensor<float>& score_state) const {
  const bool shapes_ok = ratio >= 2 && kv_state.rank() == 2 && kv_state.dim(0) == ratio &&
                         score_state.shape() == kv_state.shape() && kv.rank() == 2 && score.rank() == 2 &&
                         kv.shape() == score.shape() && kv.dim(1) == kv_state.dim(1) && start_pos >= 0;
  if (!shapes_ok || kv_state.on_host() || score_state.on_host() || !libm_expf_matches_host()) {
    count("compress", false);  // the reference raises its error, or runs on the host state
    Tensor<float> ks = host_copy(kv_state), ss = host_copy(score_state);
    reference::CompressedLatents out =
        reference::seam::reference_ops().compress(host_copy(kv), host_copy(score), start_pos, ratio, ks, ss);
    kv_state = kv_state.on_host() ? std::move(ks) : upload(std::move(ks));
    score_state = score_state.on_host() ? std::move(ss) : upload(std::move(ss));
    out.latent = upload(std::move(out.latent));
    return out;
  }
  count("compress", true);
  const int64_t dim = kv_state.dim(1), seqlen = kv.dim(0), end_pos = start_pos + seqlen;
  reference::CompressedLatents out;
  out.first_group = start_pos / ratio;
  const int64_t end_group = end_pos / ratio;
  const int64_t n = std::max<int64_t>(0, end_group - out.first_group);
  out.latent = device_tensor<float>({n, dim}, "compressor_latent");
  DevIn<float> x(kv), s(score);
  gpu::compress_pool(x.get(), s.get(), dim, start_pos, ratio, dev(kv_state), dev(score_state), out.first_group, n,
                     n > 0 ? dev(out.latent) : nullptr);
  // Then the slots, as the reference leaves them: this call's tokens of a first group that began
  // in an earlier call (written before that group was pooled there; pooling here read them from
  // the input, the same values), and the trailing partial group.
  if (n > 0 && out.first_group * ratio < start_pos) {
    gpu::compress_state_write(x.get(), s.get(), dim, start_pos, ratio, start_pos, (out.first_group + 1) * ratio,
                              dev(kv_state), dev(score_state));
  }
  gpu::compress_state_write(x.get(), s.get(), dim, start_pos, ratio, std::max(start_pos, end_group * ratio), end_pos,
                            dev(kv_state), dev(score_state));
  return out;
}

}  // namespace dsv41::gpu
