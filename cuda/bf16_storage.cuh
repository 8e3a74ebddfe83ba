// cuda/bf16_storage.cuh
//
// The two storage types of a bf16 tensor in the memory-bound kernels (cuda/kv_pack.cu,
// cuda/mhc.cu hc_post, cuda/engram.cu engram_lookup), which are templated on it:
//   float     bf16 values in fp32 storage: what the cuda/ backend keeps (4 bytes per value);
//   uint16_t  bf16 bit patterns: the production format (2 bytes per value, the roofline bytes of
//             bench/kernels_bench.cc). Value = f32_from_bits(bits << 16), exactly.
// Both variants run the same fp32 arithmetic, so their results are the same bf16 values; only
// the bytes moved differ. Every access here is 16 bytes wide (8 bf16 or 4 fp32 values): callers
// guarantee 16-byte alignment (the launchers check it or fall back to a scalar kernel).
//
// bf16 rounding: bf16x2_rn uses the hardware cvt.rn.bf16x2.f32 (one instruction for two values)
// and replaces a NaN result by 0x7FC0. That equals formats::bf16_encode on every fp32 input:
// tests/cuda/kv_quant_vs_reference_test (ScalarEncoderSweep.CudaIntrinsicEqualsDeviceExcept-
// Documented/Bf16) compares the same conversion with bf16_encode on all 2^32 inputs, and the only
// documented difference is the NaN code (CUDA 0x7FFF, formats / torch 0x7FC0), fixed here.
// Include only from .cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "base/base.h"

namespace dsv41::gpu {

// formats::bf16_encode(lo) | formats::bf16_encode(hi) << 16.
__device__ inline uint32_t bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half), .y = hi
  uint32_t w;
  std::memcpy(&w, &h, sizeof w);
  if (lo != lo) w = (w & 0xFFFF0000u) | 0x7FC0u;
  if (hi != hi) w = (w & 0x0000FFFFu) | 0x7FC00000u;
  return w;
}

// The two bf16 values of a packed word as fp32 (exact).
__device__ inline float bf16_lo(uint32_t w) { return f32_from_bits(w << 16); }
__device__ inline float bf16_hi(uint32_t w) { return f32_from_bits(w & 0xFFFF0000u); }

// Loads 8 consecutive values of a bf16 tensor (16-byte aligned) as fp32.
__device__ inline void load8(const float* __restrict__ p, float (&v)[8]) {
  const float4 a = __ldcs(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ inline void load8(const uint16_t* __restrict__ p, float (&v)[8]) {
  const uint4 a = __ldcs(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) v[2 * k] = bf16_lo(w[k]), v[2 * k + 1] = bf16_hi(w[k]);
}

// Stores 8 values rounded to bf16 (formats::round_to_bf16 / bf16_encode) to a bf16 tensor.
__device__ inline void store8_rounded(float* __restrict__ p, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = bf16x2_rn(v[2 * k], v[2 * k + 1]);
  __stcs(reinterpret_cast<float4*>(p), make_float4(bf16_lo(w[0]), bf16_hi(w[0]), bf16_lo(w[1]), bf16_hi(w[1])));
  __stcs(reinterpret_cast<float4*>(p) + 1,
         make_float4(bf16_lo(w[2]), bf16_hi(w[2]), bf16_lo(w[3]), bf16_hi(w[3])));
}
__device__ inline void store8_rounded(uint16_t* __restrict__ p, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = bf16x2_rn(v[2 * k], v[2 * k + 1]);
  __stcs(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
}

// Stores 8 bf16 values given as 4 packed words (bits already rounded).
__device__ inline void store8_bits(float* __restrict__ p, const uint32_t (&w)[4]) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(bf16_lo(w[0]), bf16_hi(w[0]), bf16_lo(w[1]), bf16_hi(w[1])));
  __stcs(reinterpret_cast<float4*>(p) + 1,
         make_float4(bf16_lo(w[2]), bf16_hi(w[2]), bf16_lo(w[3]), bf16_hi(w[3])));
}
__device__ inline void store8_bits(uint16_t* __restrict__ p, const uint32_t (&w)[4]) {
  __stcs(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
}

// True when p is 16-byte aligned (host or device).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Number of SMs of the current device (cached after the first call), for grid-stride grids.
int sm_count();

}  // namespace dsv41::gpu
