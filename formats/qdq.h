// formats/qdq.h
//
// The four block quantizers of DeepSeek-V4.1-Flash, exactly as the official inference code
// computes them (kernel.py fp4_act_quant / act_quant; research/numerics.md §0 and §4,
// research/semantics.md §2.3-2.5). Each works on one block of fp32 inputs (bf16 values in
// practice) and returns the stored scale byte and one element code per input:
//
//   recipe            block  elements  scale  scale rule (amax = max |x_i| of the block)
//   main KV           16     E2M1      E4M3   s = e4m3_rne_satfinite(fl32(max(amax, 6*2^-9) / 6))
//   indexer q/k       32     E2M1      E8M0   s = 2^ceil(log2(fl32(max(amax, 6*2^-126) * fl32(1/6))))
//   SWA KV, act quant 32     E4M3      E8M0   s = 2^ceil(log2(fl32(max(amax, 1e-4) * fl32(1/448))))
//
// Elements: FP4 code = e2m1_rne(clamp(fl32(x / s), -6, 6)); FP8 code = e4m3_rne(clamp(fl32(x / s),
// -448, 448)). The division is IEEE fp32 division (tilelang disables the a/b -> a*(1/b) rewrite);
// for the main KV scale, which is not a power of two, this matters. QDQ value = bf16(code * s):
// the product is exact in fp32; it is exact in bf16 too except at the top of the bf16 range,
// where the E8M0 recipes' value overflows to +-Inf exactly as in the official code (indexer:
// |x| >= 1.75*2^127, e.g. bf16 max -> scale 0xFD, code 6 -> Inf; FP8: |x| >= 1.9375*2^127).
//
// The SWA KV cache and the activation quantization of fp8 linears are the same function in the
// official code (act_quant(x, 32, "ue8m0"), in place or not); dsv41 keeps one implementation.
//
// Non-finite inputs: the official code has no defined result for a block holding NaN or +-Inf
// (its torch port returns NaN/0xFF scales, the tilelang kernel differs). These functions return
// `false` for such a block and still write deterministic bytes; the checked host API
// (formats/cache_format.h) turns that into a dsv41::Error naming the block.
//
// Example:
//   uint8_t scale, codes[16];
//   bool finite = quantize_compressed_kv_block(x16, &scale, codes);
#pragma once

#include <cstdint>

#include "base/base.h"
#include "formats/minifloat.h"

namespace dsv41::formats {

inline constexpr int kCompressedKvBlock = 16;
inline constexpr int kIndexBlock = 32;
inline constexpr int kFp8Block = 32;

// fl32 constants of the official code (numerics.md §10), written as bits so no compiler can
// round them differently.
inline constexpr uint32_t kInv6Bits = 0x3E2AAAABu;       // fl32(1/6)
inline constexpr uint32_t kInv448Bits = 0x3B124925u;     // fl32(1/448)
inline constexpr uint32_t kFp8AmaxFloorBits = 0x38D1B717u;  // fl32(1e-4)
inline constexpr uint32_t kCompressedKvAmaxFloorBits = 0x3C400000u;  // 6 * 2^-9 = 0.01171875
inline constexpr uint32_t kIndexAmaxFloorBits = 0x01C00000u;   // 6 * 2^-126

// max |x_i| over a block; the second result is false if any element is NaN or +-Inf.
// Compares magnitudes as integers, so the result does not depend on fmaxf's NaN rules.
DSV41_HD inline float block_amax(const float* x, int n, bool* finite) {
  uint32_t amax = 0;
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    const uint32_t a = f32_bits(x[i]) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) ok = false;
    if (a > amax) amax = a;
  }
  *finite = ok;
  return f32_from_bits(amax);
}

DSV41_HD inline float max_f32(float a, float b) { return f32_bits(a) >= f32_bits(b) ? a : b; }

// The official "fast_round_scale" (ceil to a power of two) from fp32 bits:
// byte = exponent field + (mantissa != 0). Equal to e8m0_encode_ceil for every normal t <= 2^127,
// the only values the amax floors let through (tested exhaustively). Outside that domain it is
// what the bit formula gives: NaN -> 0x00 (the field wraps), Inf and t > 2^127 -> 0xFF; blocks
// that reach those are non-finite blocks and are reported as such.
DSV41_HD inline uint8_t e8m0_ceil_official(float t) {
  const uint32_t b = f32_bits(t);
  return static_cast<uint8_t>(((b >> 23) & 0xFFu) + ((b & 0x7FFFFFu) != 0 ? 1u : 0u));
}

DSV41_HD inline float clamp_f32(float v, float lo, float hi) {
  // NaN stays NaN; -0 stays -0.
  return v < lo ? lo : (v > hi ? hi : v);
}

// (a) Main (compressed) KV: 16 values -> 1 E4M3 scale + 16 E2M1 codes.
DSV41_HD inline uint8_t compressed_kv_scale(float amax) {
  const float floored = max_f32(amax, f32_from_bits(kCompressedKvAmaxFloorBits));
  return e4m3_encode_satfinite(floored / 6.0f);
}

DSV41_HD inline bool quantize_compressed_kv_block(const float* x, uint8_t* scale, uint8_t* codes) {
  bool finite;
  const float amax = block_amax(x, kCompressedKvBlock, &finite);
  *scale = compressed_kv_scale(amax);
  const float s = e4m3_decode(*scale);
  for (int i = 0; i < kCompressedKvBlock; ++i) codes[i] = e2m1_encode(clamp_f32(x[i] / s, -6.0f, 6.0f));
  return finite;
}

// (b) Indexer q/k: 32 values -> 1 E8M0 scale (ceil) + 32 E2M1 codes.
DSV41_HD inline uint8_t index_scale(float amax) {
  const float floored = max_f32(amax, f32_from_bits(kIndexAmaxFloorBits));
  return e8m0_ceil_official(floored * f32_from_bits(kInv6Bits));
}

DSV41_HD inline bool quantize_index_block(const float* x, uint8_t* scale, uint8_t* codes) {
  bool finite;
  const float amax = block_amax(x, kIndexBlock, &finite);
  *scale = index_scale(amax);
  const float s = e8m0_decode(*scale);
  for (int i = 0; i < kIndexBlock; ++i) codes[i] = e2m1_encode(clamp_f32(x[i] / s, -6.0f, 6.0f));
  return finite;
}

// (c) SWA KV and (d) activation quant: 32 values -> 1 E8M0 scale (ceil) + 32 E4M3 codes.
DSV41_HD inline uint8_t fp8_scale(float amax) {
  const float floored = max_f32(amax, f32_from_bits(kFp8AmaxFloorBits));
  return e8m0_ceil_official(floored * f32_from_bits(kInv448Bits));
}

DSV41_HD inline bool quantize_fp8_block(const float* x, uint8_t* scale, uint8_t* codes) {
  bool finite;
  const float amax = block_amax(x, kFp8Block, &finite);
  *scale = fp8_scale(amax);
  const float s = e8m0_decode(*scale);
  for (int i = 0; i < kFp8Block; ++i) {
    codes[i] = e4m3_encode_satfinite(clamp_f32(x[i] / s, -448.0f, 448.0f));
  }
  return finite;
}

// Dequantized element value bf16(code * s); the product is exact in fp32, and bf16 rounding only
// matters where it overflows to +-Inf (see the file comment).
DSV41_HD inline float dequant_fp4_e4m3(uint8_t code, uint8_t scale) {
  return round_to_bf16(e2m1_decode(code) * e4m3_decode(scale));
}
DSV41_HD inline float dequant_fp4_e8m0(uint8_t code, uint8_t scale) {
  return round_to_bf16(e2m1_decode(code) * e8m0_decode(scale));
}
DSV41_HD inline float dequant_fp8_e8m0(uint8_t code, uint8_t scale) {
  return round_to_bf16(e4m3_decode(code) * e8m0_decode(scale));
}

}  // namespace dsv41::formats
