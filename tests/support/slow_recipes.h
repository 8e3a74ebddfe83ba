// tests/support/slow_recipes.h
//
// An independent, slow definition of the three block quantizers of formats/qdq.h, written from
// research/numerics.md §0 (decisions 2 and 3) and §10, for tests. It uses only
// tests/support/slow_minifloat.h: no formats/ code.
//
//   recipe    block  elements  scale
//   kCompressedKv   16     E2M1      E4M3 RNE satfinite of fl32(max(amax, 6*2^-9) / 6)
//   kIndex    32     E2M1      E8M0 ceil of fl32(max(amax, 6*2^-126) * fl32(1/6))
//   kFp8      32     E4M3      E8M0 ceil of fl32(max(amax, fl32(1e-4)) * fl32(1/448))
//
// Element code = RNE(clamp(fl32(x / s), -lim, lim)), lim = 6 (E2M1) or 448 (E4M3); QDQ value =
// bf16 RNE of the exact product code value * s. Only finite blocks have a definition.
//
// Example:
//   SlowBlock want = slow_quantize(SlowRecipe::kCompressedKv, x16);
//   EXPECT_EQ(want.scale, 0x23);
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/support/slow_minifloat.h"

namespace dsv41::test {

enum class SlowRecipe : uint8_t { kCompressedKv, kIndex, kFp8 };

inline constexpr SlowRecipe kAllSlowRecipes[] = {SlowRecipe::kCompressedKv, SlowRecipe::kIndex,
                                                 SlowRecipe::kFp8};

inline const char* slow_recipe_name(SlowRecipe r) {
  switch (r) {
    case SlowRecipe::kCompressedKv: return "compressed_kv";
    case SlowRecipe::kIndex: return "index";
    case SlowRecipe::kFp8: return "fp8";
  }
  return "?";
}

inline int slow_block_size(SlowRecipe r) { return r == SlowRecipe::kCompressedKv ? 16 : 32; }

// The element format, its policy and its clamp limit.
inline const SlowFormat& slow_element_format(SlowRecipe r) {
  return r == SlowRecipe::kFp8 ? slow_e4m3() : slow_e2m1();
}
inline const SlowPolicy& slow_element_policy(SlowRecipe r) {
  return r == SlowRecipe::kFp8 ? kE4m3Saturate : kE2m1Policy;
}
inline float slow_element_limit(SlowRecipe r) { return r == SlowRecipe::kFp8 ? 448.0f : 6.0f; }

// The fl32 constants, derived here (tests compare them with the literal bits of numerics.md §10).
inline float slow_inv6() { return fl32(1.0 / 6.0); }
inline float slow_inv448() { return fl32(1.0 / 448.0); }
inline float slow_fp8_floor() { return 1e-4f; }  // the compiler rounds the decimal correctly

// Exact scale value of a scale byte.
inline double slow_scale_value(SlowRecipe r, uint8_t scale) {
  return r == SlowRecipe::kCompressedKv ? slow_e4m3().values[scale & 0x7Fu] : slow_e8m0().values[scale];
}

// Scale byte from the block amax (|x| max, a float value).
inline uint8_t slow_scale(SlowRecipe r, float amax) {
  switch (r) {
    case SlowRecipe::kCompressedKv: {
      const float floored = std::fmax(amax, std::ldexp(6.0f, -9));
      return static_cast<uint8_t>(slow_encode(slow_e4m3(), kE4m3Saturate, div32(floored, 6.0f)));
    }
    case SlowRecipe::kIndex: {
      const float floored = std::fmax(amax, std::ldexp(6.0f, -126));
      return static_cast<uint8_t>(slow_encode(slow_e8m0(), kE8m0Ceil, mul32(floored, slow_inv6())));
    }
    case SlowRecipe::kFp8: {
      const float floored = std::fmax(amax, slow_fp8_floor());
      return static_cast<uint8_t>(
          slow_encode(slow_e8m0(), kE8m0Ceil, mul32(floored, slow_inv448())));
    }
  }
  return 0;
}

// Element code for x under scale s.
inline uint8_t slow_element(SlowRecipe r, float x, float s) {
  const float lim = slow_element_limit(r);
  float q = div32(x, s);
  q = q < -lim ? -lim : (q > lim ? lim : q);  // -0 stays -0
  return static_cast<uint8_t>(slow_encode(slow_element_format(r), slow_element_policy(r), q));
}

// Exact value of an element code.
inline double slow_element_value(SlowRecipe r, uint8_t code) {
  const SlowFormat& f = slow_element_format(r);
  const double v = f.values[code & (f.sign_bit() - 1u)];
  return (code & f.sign_bit()) != 0 ? -v : v;
}

// bf16 bits of the QDQ value bf16(code value * scale value); the product is exact in double.
inline uint16_t slow_qdq_bits(SlowRecipe r, uint8_t code, uint8_t scale) {
  const double v = slow_element_value(r, code) * slow_scale_value(r, scale);
  const bool negative = (code & slow_element_format(r).sign_bit()) != 0;
  return static_cast<uint16_t>(slow_encode_real(slow_bf16(), kBf16Policy, std::fabs(v), negative));
}

struct SlowBlock {
  uint8_t scale = 0;
  std::vector<uint8_t> codes;  // [block] element codes
  std::vector<uint16_t> qdq;   // [block] bf16 bits of the dequantized values
};

// x: [slow_block_size(r)] finite floats.
inline SlowBlock slow_quantize(SlowRecipe r, const float* x) {
  const int n = slow_block_size(r);
  double amax = 0;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(static_cast<double>(x[i])));
  SlowBlock out;
  out.scale = slow_scale(r, static_cast<float>(amax));
  const float s = static_cast<float>(slow_scale_value(r, out.scale));
  for (int i = 0; i < n; ++i) {
    out.codes.push_back(slow_element(r, x[i], s));
    out.qdq.push_back(slow_qdq_bits(r, out.codes.back(), out.scale));
  }
  return out;
}

}  // namespace dsv41::test
