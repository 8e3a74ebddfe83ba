// tests/support/recipe_under_test.h
//
// The formats/ functions under test, selected by the slow recipe they must match, so a test can
// loop over the three recipes without repeating a switch.
//
//   recipe    block function           dequantizer       cache format
//   kCompressedKv   quantize_compressed_kv_block   dequant_fp4_e4m3  kCompressedKvFp4
//   kIndex    quantize_index_block     dequant_fp4_e8m0  kIndexKeysFp4
//   kFp8      quantize_fp8_block       dequant_fp8_e8m0  kWindowKvFp8
//
// Example:
//   QuantizedBlock got = quantize_block(SlowRecipe::kFp8, x32);
#pragma once

#include <cstdint>
#include <vector>

#include "formats/cache_format.h"
#include "formats/qdq.h"
#include "tests/support/slow_recipes.h"

namespace dsv41::test {

using BlockFn = bool (*)(const float*, uint8_t*, uint8_t*);
using DequantFn = float (*)(uint8_t, uint8_t);

inline BlockFn block_fn(SlowRecipe r) {
  switch (r) {
    case SlowRecipe::kCompressedKv: return formats::quantize_compressed_kv_block;
    case SlowRecipe::kIndex: return formats::quantize_index_block;
    case SlowRecipe::kFp8: return formats::quantize_fp8_block;
  }
  return nullptr;
}

inline DequantFn dequant_fn(SlowRecipe r) {
  switch (r) {
    case SlowRecipe::kCompressedKv: return formats::dequant_fp4_e4m3;
    case SlowRecipe::kIndex: return formats::dequant_fp4_e8m0;
    case SlowRecipe::kFp8: return formats::dequant_fp8_e8m0;
  }
  return nullptr;
}

inline formats::CacheFormat cache_format_of(SlowRecipe r) {
  switch (r) {
    case SlowRecipe::kCompressedKv: return formats::CacheFormat::kCompressedKvFp4;
    case SlowRecipe::kIndex: return formats::CacheFormat::kIndexKeysFp4;
    case SlowRecipe::kFp8: return formats::CacheFormat::kWindowKvFp8;
  }
  return formats::CacheFormat::kBf16;
}

// One block through formats/: the stored bytes and the dequantized values.
struct QuantizedBlock {
  bool finite = false;
  uint8_t scale = 0;
  std::vector<uint8_t> codes;  // [block]
  std::vector<float> qdq;      // [block] dequant(code, scale), each a bf16 value
};

// x: [slow_block_size(r)] floats.
inline QuantizedBlock quantize_block(SlowRecipe r, const float* x) {
  QuantizedBlock b;
  b.codes.resize(slow_block_size(r));
  b.finite = block_fn(r)(x, &b.scale, b.codes.data());
  for (const uint8_t c : b.codes) b.qdq.push_back(dequant_fn(r)(c, b.scale));
  return b;
}

}  // namespace dsv41::test
