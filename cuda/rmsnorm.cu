// cuda/rmsnorm.cu ↔ reference/ops/rmsnorm.cc
//
// rms_norm: one thread per row runs the reference's emulation of torch's CPU sum (4 chains,
// 4-level cascade, 8 lanes for rows of >= 8 values) in the same order, then the same fp32
// divide, sqrt and rounding (--fmad=false, correctly rounded __f*_rn): BIT-EXACT.
// Rows of >= 32768 values are refused by the host (the reference does not model them).
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/torch_sum.cuh"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;
using torch_sum::torch_sum_sq;

// One thread per row: y = bf16(weight * (x * rsqrt(mean(x^2) + eps))).
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight, int64_t rows,
                                int64_t n, float eps, float* __restrict__ y) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * n;
  const float var = __fdiv_rn(torch_sum_sq(xr, n), static_cast<float>(n));
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
  for (int64_t i = 0; i < n; ++i) y[r * n + i] = formats::round_to_bf16(__fmul_rn(weight[i], __fmul_rn(xr[i], inv)));
}

}  // namespace

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t n, double eps, float* y) {
  if (rows == 0) return;
  rms_norm_kernel<<<grid_for(rows, kThreads), kThreads>>>(x, weight, rows, n, static_cast<float>(eps), y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
