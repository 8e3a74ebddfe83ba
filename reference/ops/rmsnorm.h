// reference/ops/rmsnorm.h
//
// RMSNorm as the official RMSNorm.forward computes it, and the fp32 sum order it depends on.
//
//   official:  x = x.float(); var = x.square().mean(-1); x = x * rsqrt(var + eps);
//              return (weight * x).to(input dtype)
//   here, per row of n values (x bf16, weight bf16, all arithmetic fp32, no FMA):
//     sq[i]  = x[i] * x[i]                                      fp32
//     sum    = torch_sum_f32(sq)                                fp32, torch's CPU order (below)
//     var    = sum / n                                          fp32 division (torch: sum, then div_)
//     r      = 1.0f / std::sqrt(var + eps_f32)                  fp32 (torch CPU rsqrt = 1 / sqrt)
//     y[i]   = round_to_bf16(weight[i] * (x[i] * r))            the one rounding to bf16
//   eps_f32 = (float)eps: torch adds the Python float eps to an fp32 tensor in fp32.
//
// The sum order is the one the oracle's torch used (CPU capability AVX2, Vectorized<float> of 8
// lanes; aten/src/ATen/native/cpu/SumKernel.cpp, cascade_sum -> vectorized_inner_sum): see
// torch_sum_f32 below. With it the reference reproduces the oracle bit for bit: kernels.h5
// rmsnorm/y (1024 values) and 5 x 85248 RMSNorm outputs of the prefill (attn_norm of layers 0, 2,
// 6, 8 and the final norm), none differing. A double-accumulated sum differs from torch in 3 of
// those 426240 outputs (1 bf16 ulp each), a sequential fp32 sum in 11: the order is part of the
// semantics at this level, so it is pinned. Other CPU capabilities of torch (AVX-512: 16 lanes)
// give other bits; the reference follows the oracle's.
//
// Example:
//   Tensor<float> h = rms_norm(x, w.attn_norm, c.norm_eps);   // x: [T, dim] bf16 -> bf16
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::reference {

// Lanes of torch's Vectorized<float> on the oracle's CPU (AVX2) and the independent accumulator
// chains of its row_sum (ilp_factor).
// torch parallelizes the reduction of one long row from 32768 elements on (at::internal::
// GRAIN_SIZE); shorter rows are reduced by one thread in the order torch_sum_f32 implements.
inline constexpr int64_t kTorchSerialSumLimit = 32768;
inline constexpr int64_t kTorchSumLanes = 8;
inline constexpr int64_t kTorchSumChains = 4;

// sum_i x[i] in fp32, in the exact order of torch's CPU sum of a contiguous fp32 row (n <= 32768,
// where torch does not split the row over threads; longer rows are rejected):
//   n < 8: scalar row_sum: 4 chains over the elements, then chain 0 += chains 1, 2, 3.
//   else:  the row is read as V = n/8 vectors of 8 lanes. row_sum: vector v goes to chain v % 4
//          (the first 4*floor(V/4) vectors, through multi_row_sum's 4-level cascade: level 0
//          takes 2^p vectors per chain, p = max(4, ceil_log2(V/4) / 4), then is added into level
//          1, which drains into level 2 each time the count of its inputs wraps at 2^p, and so
//          on; at the end levels 1..3 are added to level 0 in order); leftover vectors are added
//          to chain 0; chain 0 += chains 1, 2, 3 (lane-wise). Then the scalar tail
//          x[8V..n) is summed from 0 in order, and the 8 lanes of chain 0 are added to it left
//          to right.
// x: [n] fp32 -> fp32. Sum and accumulation are fp32 (as torch's); no FMA.
float torch_sum_f32(const float* x, int64_t n);

// 1 / sqrt(mean(x^2) + eps) in fp32 with the order above: the statistic of RMSNorm (and of
// mHC's and Engram's rsqrt(x.square().mean(-1) + eps)).
// x: [n] fp32 (bf16 values in RMSNorm) -> fp32.
float rms_rsqrt_f32(const float* x, int64_t n, double eps);

// One row: y[i] = bf16(weight[i] * (x[i] * rms_rsqrt_f32(x, n, eps))).
// x: [n] bf16 values, weight: [n] bf16 values -> y: [n] bf16 values (y may alias x).
void rms_norm_row(const float* x, const float* weight, int64_t n, double eps, float* y);

// RMSNorm over the last dimension of x, rows independent (parallel over rows; results do not
// depend on the thread count).
// x: [..., n] bf16, weight: [n] bf16 -> [..., n] bf16.
Tensor<float> rms_norm(const Tensor<float>& x, const std::vector<float>& weight, double eps);

}  // namespace dsv41::reference
