// cuda/attention_split.cuh: the device side of the production sparse attention's split
// (flash-decoding; cuda/attention_wgmma.cu "Split", the only includer): the partials' workspace
// layout, the combine kernel, the slice count and the PDL switch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/env_switch.h"
#include "cuda/tensor_core.cuh"  // store2, bf16_value

namespace dsv41::gpu::attn_split {

using tc::bf16_value;
using tc::store2;

// The split's workspace (fp32, S slices): m [T][H][S] (each slice's running max, base-2 units),
// l [T][H][S] (its sum of probabilities, no sink), then from a 16-byte boundary o [T][H][S][D] (its
// unnormalised output).
struct SplitPart {
  float* base;
  int64_t T, H, S, D;
  __host__ __device__ int64_t stats() const { return (2 * T * H * S + 3) / 4 * 4; }
  __host__ __device__ int64_t floats() const { return stats() + T * H * S * D; }
  __device__ float* m(int64_t t, int64_t h) const { return base + (t * H + h) * S; }
  __device__ float* l(int64_t t, int64_t h) const { return base + T * H * S + (t * H + h) * S; }
  __device__ float* o(int64_t t, int64_t h, int64_t s) const { return base + stats() + ((t * H + h) * S + s) * D; }
};

// The split's combine, one CTA of D/4 threads per (query, head) row, 4 channels a thread, the slices
// in order (deterministic): M = max_s m_s, f_s = exp2f(m_s - M), l = sum_s fl(l_s f_s) + the sink's
// term, o = sum_s fl(o_s f_s), out = bf16(fl(o fl(1/l))). The sums start at slice 0's term, so one
// slice gives the unsplit kernel's statements and bits (f = 1 where m_s = M).
// Launched as a programmatic dependent of the split kernel (PDL, unless DSV41_CUDA_ATTN_SPLIT_PDL=0):
// its CTAs may start while the split's run; griddepcontrol.wait holds them until the split grid has
// completed and its writes are visible (without PDL a no-op).
template <typename OutT>
__global__ void combine_kernel(SplitPart pp, const float* __restrict__ sink, OutT* __restrict__ out) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int64_t row = blockIdx.x, h = row % pp.H, t = row / pp.H;
  const int ch = 4 * static_cast<int>(threadIdx.x);
  const float* const m = pp.m(t, h);
  const float* const ls = pp.l(t, h);
  float mx = m[0];
  for (int64_t s = 1; s < pp.S; ++s) mx = fmaxf(mx, m[s]);
  float l = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t s = 0; s < pp.S; ++s) {
    const float f = m[s] == mx ? 1.0f : exp2f(__fsub_rn(m[s], mx));  // (exactly 1 for the largest)
    const float4 v = *reinterpret_cast<const float4*>(pp.o(t, h, s) + ch);
    const float vs[4] = {v.x, v.y, v.z, v.w};
    const float ll = __fmul_rn(ls[s], f);
    l = s == 0 ? ll : __fadd_rn(l, ll);
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = s == 0 ? __fmul_rn(vs[i], f) : __fadd_rn(o[i], __fmul_rn(vs[i], f));
  }
  l = __fadd_rn(l, exp2f(__fsub_rn(__fmul_rn(sink[h], 1.4426950408889634f), mx)));
  const float inv = __frcp_rn(l);
  OutT* const orow = out + row * pp.D + ch;
  store2(orow, bf16_value(__fmul_rn(o[0], inv)), bf16_value(__fmul_rn(o[1], inv)));
  store2(orow + 2, bf16_value(__fmul_rn(o[2], inv)), bf16_value(__fmul_rn(o[3], inv)));
}

// DSV41_CUDA_ATTN_SPLIT_PDL=0: the combine launched after the split grid the ordinary way.
inline bool pdl() {
  static const bool on = env_switch("DSV41_CUDA_ATTN_SPLIT_PDL", true);
  return on;
}

// Slices of slice_blocks 64-index blocks over K indices (at least one).
inline int64_t slices(int64_t K, int64_t slice_blocks) {
  const int64_t blocks = (K + 63) / 64;
  return blocks <= slice_blocks ? 1 : (blocks + slice_blocks - 1) / slice_blocks;
}

}  // namespace dsv41::gpu::attn_split
