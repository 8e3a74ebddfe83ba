// cuda/tensor_core.cuh: device helpers the production tensor-core kernels share (the fp8 linear,
// cuda/linear_fp8_wgmma.cu; the sparse attention, cuda/attention_wgmma.cu and cuda/attention_mma.cu):
// the wgmma group fences and waits, a compiler pin on wgmma results, a named barrier of two warps
// of a warpgroup pair, and the bf16 packing of fp32 pairs. Include only from .cu files.
#pragma once

#include <cstdint>

namespace dsv41::gpu::tc {

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are still in flight.
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from reading a wgmma result before the wait.
template <int N>
__device__ inline void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Warp specialization (cuda/linear_fp8_wgmma_ws.cu): a whole warpgroup gives back registers to the
// CTA's pool down to N a thread, or takes them up to N (waiting until the pool has them). N is a
// multiple of 8 in 24 .. 256; ptxas allocates the code after each to its N.
template <int N>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barrier 1 + hg over 64 threads (the two warps of head group hg).
__device__ inline void pair_sync(int hg) { asm volatile("bar.sync %0, 64;\n" ::"r"(1 + hg) : "memory"); }
// Two fp32 values rounded to bf16 (RNE), lo in the low half.
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ inline void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ inline void store2(uint16_t* p, float a, float b) { *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(a, b); }
// The bf16 rounding of x, as fp32.
__device__ inline float bf16_value(float x) { return __uint_as_float(pack_bf16x2(x, 0.0f) << 16); }

}  // namespace dsv41::gpu::tc
