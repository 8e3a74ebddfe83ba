// cuda/libm_expf.h
//
// libm_expf: the fp32 exp of the libm the reference links (glibc >= 2.28 on x86-64, the variant
// its ifunc selects on CPUs with FMA), rebuilt from correctly rounded binary64 operations so that
// a kernel gives the bits of the reference's `std::exp(float)`. Host and device (DSV41_HD); no
// libm call inside, only +, -, *, fma and bit moves, each correctly rounded on both sides.
//
// Why: the reference takes glibc's expf (the function torch's CPU kernels call), which is not
// correctly rounded (docs/cuda.md: 170,648 float inputs where it differs from the correctly rounded
// exp); CUDA's expf / __expf are other functions. A device op that must give the reference's bits
// (compress's softmax pooling) needs this routine.
//
// The algorithm (glibc sysdeps/ieee754/flt-32/e_expf.c, from Arm's optimized-routines; restated
// here in our words, with the constants that define that function):
//   x*32/ln2 = k + r, k integer (round to nearest via the 1.5*2^52 shift), |r| <= 1/2;
//   exp(x) = 2^(k/32) * 2^(r/32) ~= s * (C0 r^3 + C1 r^2 + C2 r + 1),
//   s = 2^(k/32) from a 32-entry table T[k mod 32] (the bits of 2^(i/32) rounded to binary64, less
//   i << 47) plus k << 47 in the exponent field; the product rounded once to fp32.
// glibc's FMA build fuses x*32/ln2 into both the shift (kd) and the reduction (r) and the
// polynomial's multiply-adds: the fmas below. The one non-FMA difference is in kd / r (measured:
// 2 of the 2^32 inputs, the first x = 0x4202422f; tests/cuda/libm_expf_test.cc).
// Special cases as glibc: |x| >= 88 goes through the range checks (NaN -> NaN, -Inf -> 0,
// overflow -> +Inf, underflow -> +0).
//
// Proof of equality: tests/cuda/libm_expf_test.cc compares libm_expf with std::exp on ALL 2^32
// float inputs on the host (runs in CI, no device needed) and the device routine with std::exp on
// all 2^32 on the GPU machine. CudaOps checks at start (libm_expf_matches_host, cuda_ops.cc) that
// the running process's std::exp agrees on a probe set; where it does not (another libm), the ops
// that use libm_expf fall back to the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/base.h"

namespace dsv41::gpu {

namespace libm_expf_detail {

DSV41_HD inline double fma_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
DSV41_HD inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;  // host: -ffp-contract=off
#endif
}
DSV41_HD inline double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DSV41_HD inline uint64_t f64_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
DSV41_HD inline double f64_from_bits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

// T[i] = bits(rn64(2^(i/32))) - (i << 47), i < 32: the test re-derives each entry in 100-digit
// arithmetic.
DSV41_HD inline uint64_t table(uint32_t i) {
  static constexpr uint64_t kTable[32] = {
      0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
      0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
      0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
      0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
      0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
      0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
      0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
      0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};
  return kTable[i];
}

}  // namespace libm_expf_detail

// exp(x) in fp32, bit-equal to glibc's expf (FMA variant); see above.
DSV41_HD inline float libm_expf(float x) {
  using namespace libm_expf_detail;
  // The polynomial for 2^(r/32) (exact divisions by powers of two), 32/ln2 and the shift.
  const double kC0 = 0x1.c6af84b912394p-5 / (32.0 * 32.0 * 32.0);
  const double kC1 = 0x1.ebfce50fac4f3p-3 / (32.0 * 32.0);
  const double kC2 = 0x1.62e42ff0c52d6p-1 / 32.0;
  const double kInvLn2N = 0x1.71547652b82fep+0 * 32.0;
  const double kShift = 0x1.8p+52;

  const uint32_t ux = f32_bits(x);
  const uint32_t abstop = (ux >> 20) & 0x7ffu;  // sign-less top 12 bits
  if (abstop >= (0x42b00000u >> 20)) {          // |x| >= 88 or NaN/Inf
    if (ux == 0xff800000u) return 0.0f;         // -Inf
    if (abstop >= 0x7f8u) return x + x;         // NaN (quieted), +Inf
    if (x > 0x1.62e42ep6f) return f32_from_bits(0x7f800000u);  // overflow
    if (x < -0x1.9fe368p6f) return 0.0f;                       // underflow
  }
  const double xd = static_cast<double>(x);
  double kd = fma_rn(kInvLn2N, xd, kShift);  // k + 1.5*2^52, k = round(x*32/ln2)
  const uint64_t ki = f64_bits(kd);
  kd = add_rn(kd, -kShift);
  const double r = fma_rn(kInvLn2N, xd, -kd);  // x*32/ln2 - k, exact product, one rounding
  const uint64_t t = table(static_cast<uint32_t>(ki % 32)) + (ki << 47);
  const double s = f64_from_bits(t);
  const double z = fma_rn(kC0, r, kC1);
  const double r2 = mul_rn(r, r);
  double y = fma_rn(kC2, r, 1.0);
  y = fma_rn(z, r2, y);
  y = mul_rn(y, s);
  return static_cast<float>(y);  // round to nearest even (the conversion is correctly rounded)
}

// Whether this process's std::exp(float) agrees with libm_expf on a probe set (the inputs where
// glibc's FMA and non-FMA builds differ, and a strided sweep of the whole float line). Computed
// once; the ops that use libm_expf on the device fall back to the host when it is false.
bool libm_expf_matches_host();

}  // namespace dsv41::gpu
