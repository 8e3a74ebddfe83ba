// cuda/torch_sum.cuh
//
// The reference's emulation of torch's CPU fp32 row sum (reference/ops/rmsnorm.h torch_sum_f32: 4
// chains, a 4-level cascade, 8 lanes for rows of >= 8 values) as device code, over the values
// at(i) of a functor (torch_sum), or over the SQUARES of a row (torch_sum_sq: the statistic of
// RMSNorm, mHC's raw mixes and Engram's gate). Every add and multiply is a
// correctly rounded __fadd_rn / __fmul_rn in the reference's order: bit-exact. Rows of >= 32768
// values are not modelled (the callers refuse them on the host). Include only from .cu files.
#pragma once

#include "cuda/common.cuh"

namespace dsv41::gpu::torch_sum {

inline constexpr int kChains = 4;  // kTorchSumChains
inline constexpr int kLevels = 4;  // multi_row_sum's num_levels
inline constexpr int kLanes = 8;   // kTorchSumLanes

// The squares of a row: at(i) = fl(x[i] * x[i]).
struct Squares {
  const float* x;
  __device__ float operator()(int64_t i) const { return __fmul_rn(x[i], x[i]); }
};

// row_sum<W> of reference/ops/rmsnorm.cc over the values at(i): `count` groups of W lanes.
template <int W, typename At>
__device__ inline void row_sum(const At& at, int64_t count, float (&out)[W]) {
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
        for (int l = 0; l < W; ++l) acc[0][k][l] = __fadd_rn(acc[0][k][l], at((i * kChains + k) * W + l));
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
      for (int l = 0; l < W; ++l) acc[0][k][l] = __fadd_rn(acc[0][k][l], at((i * kChains + k) * W + l));
  }
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kChains; ++k)
      for (int l = 0; l < W; ++l) acc[0][k][l] = __fadd_rn(acc[0][k][l], acc[j][k][l]);
  for (int64_t g = rows * kChains; g < count; ++g)
    for (int l = 0; l < W; ++l) acc[0][0][l] = __fadd_rn(acc[0][0][l], at(g * W + l));
  for (int k = 1; k < kChains; ++k)
    for (int l = 0; l < W; ++l) acc[0][0][l] = __fadd_rn(acc[0][0][l], acc[0][k][l]);
  for (int l = 0; l < W; ++l) out[l] = acc[0][0][l];
}

// torch_sum_f32 of at(0) .. at(n - 1).
template <typename At>
__device__ inline float torch_sum(const At& at, int64_t n) {
  if (n < kLanes) {
    float one[1];
    row_sum<1>(at, n, one);
    return one[0];
  }
  const int64_t vectors = n / kLanes;
  float lanes[kLanes];
  row_sum<kLanes>(at, vectors, lanes);
  float sum = 0.0f;
  for (int64_t i = vectors * kLanes; i < n; ++i) sum = __fadd_rn(sum, at(i));
  for (int l = 0; l < kLanes; ++l) sum = __fadd_rn(sum, lanes[l]);
  return sum;
}

// torch_sum_f32 of the squares of x[0 .. n).
__device__ inline float torch_sum_sq(const float* x, int64_t n) { return torch_sum(Squares{x}, n); }

}  // namespace dsv41::gpu::torch_sum
