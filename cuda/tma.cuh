// cuda/tma.cuh: the bulk tensor copy (TMA) and the shared-memory mbarriers it completes on, for the
// pipelined fp8 GEMM (cuda/linear_fp8_wgmma_pipe.cu). Include only from .cu files.
//   A stage's tile: one thread arms the stage's mbarrier with the bytes to come (arrive.expect_tx,
//   the barrier's one arrival) and issues the copies; each consumer waits for the phase (parity
//   flips with each reuse of the barrier). Rows and columns outside the tensor arrive as zeros.
#pragma once

#include <cuda.h>

#include <cstdint>

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
__device__ inline bool mbar_try_wait(uint64_t* bar, unsigned parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(fp8::smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
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

}  // namespace dsv41::gpu::tma
