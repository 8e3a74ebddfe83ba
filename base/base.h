// base/base.h
//
// The bottom of the include tree: the host/device qualifier, exact bit casts and small integer
// helpers that every other file may use. C++17 and the standard library only, so that `.cu`
// translation units can include it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSV41_HD __host__ __device__
#else
#define DSV41_HD
#endif

namespace dsv41 {

// Exact reinterpretation of a float's IEEE-754 binary32 bits (no value conversion).
DSV41_HD inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

DSV41_HD inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

DSV41_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Number of significant bits of v (0 for v == 0): one count-leading-zeros instruction.
DSV41_HD inline int bit_length(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return v == 0 ? 0 : 32 - __clz(static_cast<int>(v));
#else
  return v == 0 ? 0 : 32 - __builtin_clz(v);
#endif
}

// The float equal to sig * 2^exp2, for values that binary32 represents exactly (normal or
// subnormal). Exactness is the caller's contract; the minifloat decoders only produce such
// values. No rounding and no libm call: the result is the same on every host and device.
DSV41_HD inline float f32_compose(uint32_t sign, uint32_t sig, int exp2) {
  if (sig == 0) return f32_from_bits(sign << 31);
  const int n = bit_length(sig);
  const int lead = exp2 + n - 1;  // exponent of the leading bit
  uint32_t bits;
  if (lead >= -126) {
    const uint32_t frac = n <= 24 ? (sig << (24 - n)) & 0x7FFFFFu : (sig >> (n - 24)) & 0x7FFFFFu;
    bits = (static_cast<uint32_t>(lead + 127) << 23) | frac;
  } else {
    bits = sig << (exp2 + 149);  // subnormal: value = bits * 2^-149
  }
  return f32_from_bits((sign << 31) | bits);
}

}  // namespace dsv41
