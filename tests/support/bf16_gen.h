// tests/support/bf16_gen.h
//
// rapidcheck generators of bf16-valued floats for the property tests of formats/.
//
//   gen_bf16_bits()          any bf16 pattern; specials (+-0, subnormals, max, +-Inf, NaN, the
//                            amax floors, E2M1/E4M3 tie points) are weighted in
//   gen_scalar_float()       any fp32 pattern or a bf16 value: inputs of the scalar encoders
//   gen_bf16_block(n, hi)    n finite bf16 values with a per-block magnitude: a top exponent
//                            field T, a spread W (0..40 binades below T), each element
//                            2^(T - U[0, W]) * (1.m), random sign; sometimes +-0, a copy of
//                            another element (ties in |x|), an exact E2M1/E4M3 tie times a
//                            power of two, or an E4M3-grid amax
//
// hi bounds the exponent field: 253 keeps |x| < 2^127, below the range where the E8M0 recipes'
// QDQ overflows to Inf (|x| >= 1.75 * 2^127, see qdq_adversarial_test.cc).
//
// rapidcheck prints the seed of a failing run; replay it with RC_PARAMS="seed=<n>" (and
// "max_success=<n>" for longer runs).
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <vector>

#include "tests/support/slow_minifloat.h"

namespace dsv41::test {

inline rc::Gen<uint16_t> gen_bf16_special_bits() {
  return rc::gen::element<uint16_t>(
      0x0000, 0x8000,          // +-0
      0x0001, 0x8001, 0x007F,  // subnormals
      0x0080,                  // smallest normal
      0x7F7F, 0xFF7F,          // +-max
      0x7F80, 0xFF80,          // +-Inf
      0x7FC0, 0xFFC1,          // NaN
      0x3C40, 0x01C0, 0x38D1,  // amax floors (main KV, index), just below fl32(1e-4)
      0x3E80, 0x3F40, 0x3FA0,  // E2M1 ties 0.25, 0.75, 1.25
      0x3FE0, 0x4020, 0x4060,  // 1.75, 2.5, 3.5
      0x40A0, 0x40C0, 0x43E0,  // 5, 6, 448
      0x4188, 0x4528);         // 17 (E4M3 tie), 2688 (main KV scale saturation)
}

inline rc::Gen<uint16_t> gen_bf16_bits() {
  return rc::gen::weightedOneOf<uint16_t>(
      {{3, rc::gen::arbitrary<uint16_t>()}, {1, gen_bf16_special_bits()}});
}

inline rc::Gen<float> gen_scalar_float() {
  return rc::gen::weightedOneOf<float>(
      {{2, rc::gen::map(rc::gen::arbitrary<uint32_t>(), float_from)},
       {1, rc::gen::map(gen_bf16_bits(), [](uint16_t b) { return bf16_to_float(b); })}});
}

// One element of a block whose top exponent field is top and spread is spread.
inline float gen_block_element(int top, int spread, const std::vector<float>& so_far) {
  const int kind = *rc::gen::inRange(0, 20);
  const uint32_t sign = *rc::gen::inRange(0, 2) != 0 ? 0x8000u : 0u;
  if (kind == 0) return bf16_to_float(sign);  // +-0
  if (kind == 1 && !so_far.empty()) {         // |x| equal to an earlier element
    return bf16_to_float((float_bits(*rc::gen::elementOf(so_far)) >> 16) ^ sign);
  }
  if (kind == 2) {  // an E2M1 tie (or grid point) times 2^k, within the block's range
    const uint32_t tie = *rc::gen::element<uint32_t>(0x3E80, 0x3F40, 0x3FA0, 0x3FE0, 0x4020,
                                                     0x4060, 0x40A0, 0x40C0, 0x4080);
    const int shift = *rc::gen::inRange(0, spread + 1);
    const int field = static_cast<int>(tie >> 7) + (top - 129) - shift;
    if (field >= 1 && field <= 254) {
      return bf16_to_float(sign | static_cast<uint32_t>(field) << 7 | (tie & 0x7Fu));
    }
  }
  const int field = top - *rc::gen::inRange(0, spread + 1);
  const uint32_t man = static_cast<uint32_t>(*rc::gen::inRange(0, 128));
  return bf16_to_float(sign | static_cast<uint32_t>(field < 0 ? 0 : field) << 7 | man);
}

inline rc::Gen<std::vector<float>> gen_bf16_block(int n, int top_hi = 253) {
  return rc::gen::exec([n, top_hi] {
    // Top field: mostly where real activations live, sometimes anywhere incl. subnormal blocks.
    const int top = *rc::gen::weightedOneOf<int>(
        {{3, rc::gen::inRange(115, 150)}, {1, rc::gen::inRange(0, top_hi + 1)}});
    const int spread = *rc::gen::element(0, 1, 3, 8, 20, 40);
    std::vector<float> x;
    for (int i = 0; i < n; ++i) x.push_back(gen_block_element(top, spread, x));
    return x;
  });
}

// A row of `blocks` blocks of n elements, each block with its own magnitude.
inline rc::Gen<std::vector<float>> gen_bf16_row(int n, int blocks, int top_hi = 253) {
  return rc::gen::exec([n, blocks, top_hi] {
    std::vector<float> row;
    for (int b = 0; b < blocks; ++b) {
      const std::vector<float> block = *gen_bf16_block(n, top_hi);
      row.insert(row.end(), block.begin(), block.end());
    }
    return row;
  });
}

}  // namespace dsv41::test
