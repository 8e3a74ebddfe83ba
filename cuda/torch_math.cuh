// cuda/torch_math.cuh
//
// Device twins of the reference's own fp32 transcendentals that are built from correctly rounded
// basic operations only, so the device gives the same bits as the host (include only from .cu
// files; --fmad=false; every operation an explicit __f*_rn intrinsic):
//   torch_vec_exp_f32   reference/ops/mhc.cc: SLEEF's expf_u10 in fp32 with explicit fmas
//                       (std::fma = __fmaf_rn, std::nearbyint in the default mode = rintf, ties
//                       to even), the same constants, the same 2^q in two exponent-field steps.
//   torch_sigmoid_f32   1 / (1 + torch_vec_exp_f32(-z)).
// (std::exp / std::log of glibc are NOT here: no device routine is proven equal to them.)
#pragma once

#include <cmath>

#include "cuda/common.cuh"

namespace dsv41::gpu::torch_math {

// 2^q as a float for -126 <= q <= 127 (exponent field only), as reference/ops/mhc.cc pow2i.
__device__ inline float pow2i(int q) { return __uint_as_float(static_cast<uint32_t>(q + 127) << 23); }

__device__ inline float torch_vec_exp_f32(float x) {
  constexpr float kLog2e = 1.442695040888963407359924681001892137426645954152985934135449406931f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  constexpr float kPoly[] = {0.000198527617612853646278381f, 0.00139304355252534151077271f,
                             0.00833336077630519866943359f,  0.0416664853692054748535156f,
                             0.166666671633720397949219f,    0.5f};
  if (x != x) return x;  // NaN
  if (x < -104.0f) return 0.0f;
  if (x > 100.0f) return __int_as_float(0x7f800000);  // +Inf (HUGE_VALF)
  const int q = static_cast<int>(rintf(__fmul_rn(x, kLog2e)));
  const float qf = static_cast<float>(q);
  float s = __fmaf_rn(qf, -kLn2Hi, x);
  s = __fmaf_rn(qf, -kLn2Lo, s);
  float u = kPoly[0];
#pragma unroll
  for (int k = 1; k < 6; ++k) u = __fmaf_rn(u, s, kPoly[k]);
  u = __fadd_rn(1.0f, __fmaf_rn(__fmul_rn(s, s), u, s));
  return __fmul_rn(__fmul_rn(u, pow2i(q >> 1)), pow2i(q - (q >> 1)));
}

__device__ inline float torch_sigmoid_f32(float z) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, torch_vec_exp_f32(-z))); }

}  // namespace dsv41::gpu::torch_math
