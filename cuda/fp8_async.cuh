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

}  // namespace dsv41::gpu::fp8
