// cuda/common.cuh
//
// Shared by the .cu files of dsv41_cuda (and GPU benches): the DSV41_CUDA_CHECK macro and small
// device-only helpers. Include only from .cu files; host code uses cuda/device.h.
//
// Example:
//   DSV41_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
//   my_kernel<<<grid, block, 0, gpu::as_stream(stream)>>>(...);
//   DSV41_CUDA_CHECK(cudaGetLastError());
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "base/error.h"

// Throws dsv41::Error("file:line: CUDA call `expr` failed: cudaErrorX: text") unless expr
// returns cudaSuccess.
#define DSV41_CUDA_CHECK(expr)                                                            \
  do {                                                                                    \
    const cudaError_t dsv41_cuda_err_ = (expr);                                           \
    if (dsv41_cuda_err_ != cudaSuccess) {                                                 \
      throw ::dsv41::Error(::dsv41::detail::concat(                                       \
          __FILE__, ":", __LINE__, ": CUDA call `", #expr, "` failed: ",                  \
          cudaGetErrorName(dsv41_cuda_err_), ": ", cudaGetErrorString(dsv41_cuda_err_))); \
    }                                                                                     \
  } while (0)

namespace dsv41::gpu {

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Blocks of `threads` threads covering `n` work items (at least one block).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

// Loads N floats (N % 4 == 0) from 16-byte aligned global memory, 16 bytes per access.
template <int N>
__device__ inline void load_f32(const float* __restrict__ src, float (&dst)[N]) {
  static_assert(N % 4 == 0, "load_f32 moves whole float4s");
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    const float4 v = __ldcs(reinterpret_cast<const float4*>(src) + k);
    dst[4 * k] = v.x;
    dst[4 * k + 1] = v.y;
    dst[4 * k + 2] = v.z;
    dst[4 * k + 3] = v.w;
  }
}

// Stores N floats (N % 4 == 0) to 16-byte aligned global memory, 16 bytes per access.
template <int N>
__device__ inline void store_f32(float* __restrict__ dst, const float (&src)[N]) {
  static_assert(N % 4 == 0, "store_f32 moves whole float4s");
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    __stcs(reinterpret_cast<float4*>(dst) + k,
           make_float4(src[4 * k], src[4 * k + 1], src[4 * k + 2], src[4 * k + 3]));
  }
}

// Stores N bytes (N % 4 == 0) with the widest accesses the address allows (16, 8, 4 or 1
// bytes): packed entries are not all aligned (68 B index entries; 34 B for the tiny dim 64).
template <int N>
__device__ inline void store_bytes(uint8_t* __restrict__ dst, const uint8_t (&src)[N]) {
  static_assert(N % 4 == 0, "store_bytes moves whole words");
  uint32_t w[N / 4];
  std::memcpy(w, src, N);
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if (N % 16 == 0 && a % 16 == 0) {
#pragma unroll
    for (int k = 0; k < N / 16; ++k) {
      reinterpret_cast<uint4*>(dst)[k] =
          make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    }
  } else if (N % 8 == 0 && a % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      reinterpret_cast<uint2*>(dst)[k] = make_uint2(w[2 * k], w[2 * k + 1]);
    }
  } else if (a % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) reinterpret_cast<uint32_t*>(dst)[k] = w[k];
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = src[k];
  }
}

// Loads N bytes (N % 4 == 0) with the widest accesses the address allows, like store_bytes.
template <int N>
__device__ inline void load_bytes(const uint8_t* __restrict__ src, uint8_t (&dst)[N]) {
  static_assert(N % 4 == 0, "load_bytes moves whole words");
  uint32_t w[N / 4];
  const uintptr_t a = reinterpret_cast<uintptr_t>(src);
  if (N % 16 == 0 && a % 16 == 0) {
#pragma unroll
    for (int k = 0; k < N / 16; ++k) {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(src) + k);
      w[4 * k] = v.x;
      w[4 * k + 1] = v.y;
      w[4 * k + 2] = v.z;
      w[4 * k + 3] = v.w;
    }
  } else if (N % 8 == 0 && a % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      const uint2 v = __ldcs(reinterpret_cast<const uint2*>(src) + k);
      w[2 * k] = v.x;
      w[2 * k + 1] = v.y;
    }
  } else if (a % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) w[k] = __ldcs(reinterpret_cast<const unsigned int*>(src) + k);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = src[k];
    return;
  }
  std::memcpy(dst, w, N);
}

}  // namespace dsv41::gpu
