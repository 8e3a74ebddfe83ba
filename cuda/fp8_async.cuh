// cuda/fp8_async.cuh: the cp.async helpers of the production fp8 linear (cuda/linear_fp8_mma.cu,
// cuda/linear_fp8_wgmma.cu). Include only from .cu files.
#pragma once

#include <cstdint>

namespace dsv41::gpu::fp8 {

__device__ inline unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// 16 (or 4) bytes global -> shared; src_bytes 0 fills zeros (outside the matrix).
__device__ inline void cp_async16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One stage's scales of a (kBM x kBN) output tile at K block kb0 (kKb blocks of kBlock), zero-filled
// outside the matrices: activation scales xs [T, nkb] -> as [kBM][kKb], weight scales
// wsc [out / kBlock, nkb] -> ws [kBN / kBlock][kKb]. Both fp8 linear kernels stage them this way.
template <int kBM, int kBN, int kKb, int kBlock, int kThreads>
__device__ inline void load_stage_scales(float* as, float* ws, const float* xs, const float* wsc, int64_t m0, int64_t n0,
                                         int64_t kb0, int64_t nkb, int64_t T, int64_t out, int tid) {
#pragma unroll
  for (int it = 0; it < kBM * kKb / kThreads; ++it) {
    const int c = it * kThreads + tid, r = c / kKb, j = c % kKb;
    const bool ok = m0 + r < T && kb0 + j < nkb;
    cp_async4(as + c, ok ? xs + (m0 + r) * nkb + kb0 + j : xs, ok ? 4 : 0);
  }
  if (tid < (kBN / kBlock) * kKb) {
    const int r = tid / kKb, j = tid % kKb;
    const int64_t ot = n0 / kBlock + r;
    const bool ok = ot * kBlock < out && kb0 + j < nkb;
    cp_async4(ws + tid, ok ? wsc + ot * nkb + kb0 + j : wsc, ok ? 4 : 0);
  }
}

}  // namespace dsv41::gpu::fp8
