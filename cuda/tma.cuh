// cuda/tma.cuh: the bulk tensor copy (TMA), its tensor maps, and the shared-memory mbarriers it
// completes on, for the pipelined and the warp-specialized fp8 GEMMs (cuda/linear_fp8_wgmma_pipe.cu,
// cuda/linear_fp8_wgmma_ws.cu). Include only from .cu files.
//   A stage's tile: one thread arms the stage's mbarrier with the bytes to come (arrive.expect_tx,
//   the barrier's one arrival) and issues the copies; each consumer waits for the phase (parity
//   flips with each reuse of the barrier). Rows and columns outside the tensor arrive as zeros.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/fp8_async.cuh"

namespace dsv41::gpu::tma {

__device__ inline void mbar_init(uint64_t* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fp8::smem_addr(bar)), "r"(arrivals) : "memory");
}
// The barriers' initialisation visible to the copy engine (then a CTA barrier before any use).
__device__ inline void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ inline void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(fp8::smem_addr(bar)), "r"(bytes)
               : "memory");
}
// One arrival (release: this thread's earlier shared-memory reads and writes come before the phase).
__device__ inline void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(fp8::smem_addr(bar)) : "memory");
}
// The same from the threads where pred holds, without a branch.
__device__ inline void mbar_arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
          fp8::smem_addr(bar)),
      "r"(static_cast<uint32_t>(pred))
      : "memory");
}
// One arrival once every cp.async this thread issued before has landed (.noinc: the arrival is one
// of those the barrier was initialised with).
__device__ inline void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fp8::smem_addr(bar)) : "memory");
}
__device__ inline bool mbar_try_wait(uint64_t* bar, unsigned parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(fp8::smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits for the phase of the given parity to complete, without a time limit: for threads whose
// barrier completes only after one that a timed wait (below) watches; a __trap() on the path costs
// a register-heavy thread spills (the fp8 GEMMs' consumer warpgroups).
__device__ inline void mbar_wait_untimed(uint64_t* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// Waits for the phase of the given parity to complete. A copy that never lands (a bad tensor map)
// traps after about 2^34 cycles (seconds) instead of hanging the device: the launch fails.
__device__ inline void mbar_wait(uint64_t* bar, unsigned parity) {
  if (mbar_try_wait(bar, parity)) return;
  const long long t0 = clock64();
  while (!mbar_try_wait(bar, parity)) {
    if (clock64() - t0 > (1ll << 34)) __trap();
  }
}
// The box at (x, y) (x the inner, contiguous coordinate) of a 2-D tensor map -> dst, completing on bar.
__device__ inline void load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(fp8::smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(fp8::smem_addr(bar))
      : "memory");
}

// Host: a 2-D tensor map of a row-major [rows, cols] tensor of elem_bytes-byte elements (rows
// cols * elem_bytes bytes apart, a multiple of 16), box box_rows x box_cols, zeros outside.
// cuTensorMapEncodeTiled through the runtime's entry point (no link against the driver library);
// `what` names the caller and the tensor in errors.
inline CUtensorMap encode_2d(const void* base, CUtensorMapDataType type, int elem_bytes, int64_t rows, int64_t cols,
                             int box_rows, int box_cols, CUtensorMapSwizzle swizzle, const char* what) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DSV41_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    DSV41_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                "tma::encode_2d: the driver has no cuTensorMapEncodeTiled (the TMA loads need it)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols * elem_bytes)};  // bytes between rows
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSV41_CHECK(r == CUDA_SUCCESS, what, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for [", rows,
              ", ", cols, "] x ", elem_bytes, " bytes at ", base);
  return map;
}

}  // namespace dsv41::gpu::tma
