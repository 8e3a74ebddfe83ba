// cuda/fp8_wgmma.cuh: the wgmma pieces both production fp8 GEMM kernels share (the serial one,
// cuda/linear_fp8_wgmma.cu, and the pipelined one, cuda/linear_fp8_wgmma_pipe.cu): the 128-byte
// swizzled K-major tile layout, its shared-memory descriptor, and the e4m3 wgmma instructions with
// a zero accumulator (scale-d = 0). Include only from .cu files.
#pragma once

#include <cstdint>

#include "cuda/fp8_async.cuh"
#include "formats/minifloat.h"

namespace dsv41::gpu::fp8 {

// The wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle: start address,
// leading offset 16 bytes (unused by this layout), stride 1024 bytes between 8-row groups.
__device__ inline uint64_t sw128_desc(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr >> 4) & 0x3FFFull) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
// Byte offset of 16-byte chunk c of row r in a [rows][128] 128-byte-swizzled tile.
__device__ inline int sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// d = a b (scale-d = 0: no accumulator input): 64 x 128 x 32, e4m3, fp32 out. Fragment: thread
// (warp w, lane 4 g + q) holds d[4 j + {0, 1}] at row 16 w + g, columns 8 j + 2 q + {0, 1}, and
// d[4 j + {2, 3}] at row 16 w + g + 8.
__device__ inline void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 0, 1, 1;\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}
// d = a b: 64 x 64 x 32 (the same fragment, j < 8).
__device__ inline void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 0, 1, 1;\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}
// The same two with d as an in-out operand ("+f"), still scale-d = 0 (d's old values are not read
// by the tensor core): a loop-carried result set then keeps its registers, with no copy of a
// result still in flight, which would make ptxas serialize the wgmmas (the pipelined kernel).
__device__ inline void wgmma_m64n128k32_e4m3_inout(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 0, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}
__device__ inline void wgmma_m64n64k32_e4m3_inout(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 0, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}
// d = a b: 64 x 8 x 32 (the probe).
__device__ inline void wgmma_m64n8k32_e4m3(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, 0, 1, 1;\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "l"(desc_a), "l"(desc_b));
}
// The N-wide in-out one (N = 128 or 64).
template <int N>
__device__ inline void wgmma_e4m3_inout(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(N == 128 || N == 64, "wgmma_e4m3_inout: N is 128 or 64");
  if constexpr (N == 128) {
    wgmma_m64n128k32_e4m3_inout(d, desc_a, desc_b);
  } else {
    wgmma_m64n64k32_e4m3_inout(d, desc_a, desc_b);
  }
}

// The GEMMs' epilogue: a thread's wgmma m64nN accumulator fragment acc [N / 2] (rows t0 and t0 + 8,
// columns c0 + 8 j + {0, 1}) as bf16 values into y [T, out] (the backend's bf16 tensors are fp32
// storage); rows past T and columns past out are not written.
template <int N>
__device__ __forceinline__ void store_bf16_fragment(const float (&acc)[N / 2], float* y, int64_t T, int64_t out,
                                                    int64_t t0, int64_t c0) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t t = t0 + h * 8;
    if (t >= T) continue;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const int64_t o = c0 + j * 8;
      const float v0 = formats::round_to_bf16(acc[4 * j + 2 * h]), v1 = formats::round_to_bf16(acc[4 * j + 2 * h + 1]);
      float* dst = y + t * out + o;
      if (o + 1 < out && out % 2 == 0) {
        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
      } else {
        if (o < out) dst[0] = v0;
        if (o + 1 < out) dst[1] = v1;
      }
    }
  }
}

}  // namespace dsv41::gpu::fp8
