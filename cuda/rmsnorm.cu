// cuda/rmsnorm.cu ↔ reference/rmsnorm.cc
//
// rms_norm: one thread per row runs the reference's emulation of torch's CPU sum (4 chains,
// 4-level cascade, 8 lanes for rows of >= 8 values) in the same order, then the same fp32
// divide, sqrt and rounding (--fmad=false, correctly rounded __f*_rn): BIT-EXACT.
// Rows of >= 32768 values are refused by the host (the reference does not model them).
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kChains = 4;  // kTorchSumChains
constexpr int kLevels = 4;  // multi_row_sum's num_levels
constexpr int kLanes = 8;   // kTorchSumLanes

__device__ inline float sq_at(const float* x, int64_t i) { return __fmul_rn(x[i], x[i]); }

// row_sum<W> of reference/rmsnorm.cc over the squares of x: `count` groups of W lanes.
template <int W>
__device__ void row_sum(const float* x, int64_t count, float (&out)[W]) {
  const int64_t rows = count / kChains;
  int64_t lg = 0;
  while ((int64_t{1} << lg) < rows) ++lg;
  const int64_t level_power = lg / kLevels > 4 ? lg / kLevels : 4;
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  float acc[kLevels][kChains][W];
  for (int a = 0; a < kLevels; ++a)
    for (int k = 0; k < kChains; ++k)
      for (int l = 0; l < W; ++l) acc[a][k][l] = 0.0f;
  int64_t i = 0;
  while (i + level_step <= rows) {
    for (int64_t j = 0; j < level_step; ++j, ++i) {
      for (int k = 0; k < kChains; ++k)
        for (int l = 0; l < W; ++l) acc[0][k][l] = __fadd_rn(acc[0][k][l], sq_at(x, (i * kChains + k) * W + l));
    }
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kChains; ++k)
        for (int l = 0; l < W; ++l) {
          acc[j][k][l] = __fadd_rn(acc[j][k][l], acc[j - 1][k][l]);
          acc[j - 1][k][l] = 0.0f;
        }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < rows; ++i) {
    for (int k = 0; k < kChains; ++k)
      for (int l = 0; l < W; ++l) acc[0][k][l] = __fadd_rn(acc[0][k][l], sq_at(x, (i * kChains + k) * W + l));
  }
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kChains; ++k)
      for (int l = 0; l < W; ++l) acc[0][k][l] = __fadd_rn(acc[0][k][l], acc[j][k][l]);
  for (int64_t g = rows * kChains; g < count; ++g)
    for (int l = 0; l < W; ++l) acc[0][0][l] = __fadd_rn(acc[0][0][l], sq_at(x, g * W + l));
  for (int k = 1; k < kChains; ++k)
    for (int l = 0; l < W; ++l) acc[0][0][l] = __fadd_rn(acc[0][0][l], acc[0][k][l]);
  for (int l = 0; l < W; ++l) out[l] = acc[0][0][l];
}

// torch_sum_f32 of the squares of x[0 .. n).
__device__ float torch_sum_sq(const float* x, int64_t n) {
  if (n < kLanes) {
    float one[1];
    row_sum<1>(x, n, one);
    return one[0];
  }
  const int64_t vectors = n / kLanes;
  float lanes[kLanes];
  row_sum<kLanes>(x, vectors, lanes);
  float sum = 0.0f;
  for (int64_t i = vectors * kLanes; i < n; ++i) sum = __fadd_rn(sum, sq_at(x, i));
  for (int l = 0; l < kLanes; ++l) sum = __fadd_rn(sum, lanes[l]);
  return sum;
}

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
