// rapidcheck properties of the block recipes, the packed entries and the scalar encoders.
// Inputs: bf16-valued blocks with a per-block magnitude spread (tests/support/bf16_gen.h), rows of
// 1..4 blocks (dims 16..64 main KV, 32..128 index/SWA), and arbitrary fp32 patterns for the
// scalar encoders.
//
// rapidcheck prints its seed when a property fails; replay with
//   RC_PARAMS="seed=<n>" ./formats_qdq_property_test --gtest_filter='QdqProperty.<Name>'
// and search longer with RC_PARAMS="max_success=100000".
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "tests/support/bf16_gen.h"
#include "tests/support/recipe_under_test.h"
#include "tests/support/slow_recipes.h"

namespace dsv41::formats {
namespace {

using test::QuantizedBlock;
using test::SlowRecipe;

struct Case {
  SlowRecipe r;
  int n;                  // block size
  int blocks;             // blocks in the row
  std::vector<float> x;   // [blocks * n] finite bf16 values
  int dim() const { return n * blocks; }
  const float* block(int b) const { return x.data() + static_cast<size_t>(b) * n; }
};

Case gen_case() {
  Case c;
  c.r = *rc::gen::element(SlowRecipe::kCompressedKv, SlowRecipe::kIndex, SlowRecipe::kFp8);
  c.n = test::slow_block_size(c.r);
  c.blocks = *rc::gen::inRange(1, 5);
  c.x = *test::gen_bf16_row(c.n, c.blocks);
  return c;
}

uint8_t sign_bit(SlowRecipe r) { return r == SlowRecipe::kFp8 ? 0x80 : 0x8; }

double block_amax(const float* x, int n) {
  double amax = 0;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(static_cast<double>(x[i])));
  return amax;
}

// qdq(qdq(x)) == qdq(x) bit for bit. Main KV exception: scales 0x02..0x07 (E4M3 subnormals above
// the floor) can leave the block max below code 7, and the second pass then picks another scale
// (worked example in qdq_adversarial_test.cc, CompressedKvQdqNotIdempotentForSubnormalScales).
RC_GTEST_PROP(QdqProperty, QdqIsIdempotent, ()) {
  const Case c = gen_case();
  const CacheFormat f = test::cache_format_of(c.r);
  const std::vector<float> once = qdq_rows(f, c.x, 1, c.dim());
  const std::vector<float> twice = qdq_rows(f, once, 1, c.dim());
  for (int b = 0; b < c.blocks; ++b) {
    const uint8_t scale = test::quantize_block(c.r, c.block(b)).scale;
    if (c.r == SlowRecipe::kCompressedKv && scale >= 0x02 && scale <= 0x07) continue;
    for (int i = b * c.n; i < (b + 1) * c.n; ++i) RC_ASSERT(f32_bits(twice[i]) == f32_bits(once[i]));
  }
}

RC_GTEST_PROP(QdqProperty, Bf16QdqIsIdempotent, ()) {
  const std::vector<float> x = *rc::gen::container<std::vector<float>>(
      7, rc::gen::suchThat(test::gen_scalar_float(), [](float v) {
        return std::fabs(v) <= 3.3e38f;  // finite and below the bf16 overflow threshold
      }));
  const std::vector<float> once = qdq_rows(CacheFormat::kBf16, x, 1, 7);
  for (int i = 0; i < 7; ++i) RC_ASSERT(bf16_encode(x[i]) == (f32_bits(once[i]) >> 16));
  RC_ASSERT(qdq_rows(CacheFormat::kBf16, once, 1, 7) == once);
}

// unpack(pack(x)) equals the per-element QDQ computed (independently, slow_qdq_bits) from the
// block function's codes and scale, and the entry stores exactly that scale byte and those codes.
RC_GTEST_PROP(QdqProperty, UnpackOfPackIsCodesTimesStoredScale, ()) {
  const Case c = gen_case();
  const CacheFormat f = test::cache_format_of(c.r);
  const std::vector<uint8_t> bytes = pack_rows(f, c.x, 1, c.dim());
  const std::vector<float> back = unpack_rows(f, bytes, 1, c.dim());
  const bool fp4 = c.r != SlowRecipe::kFp8;
  const int value_bytes = fp4 ? c.dim() / 2 : c.dim();
  for (int b = 0; b < c.blocks; ++b) {
    const QuantizedBlock q = test::quantize_block(c.r, c.block(b));
    RC_ASSERT(q.finite);
    RC_ASSERT(bytes[value_bytes + b] == q.scale);
    for (int i = 0; i < c.n; ++i) {
      const int e = b * c.n + i;
      // element 2k is the low nibble of byte k
      const uint8_t stored = fp4 ? (bytes[e / 2] >> (e % 2 ? 4 : 0)) & 0xF : bytes[e];
      RC_ASSERT(stored == q.codes[i]);
      const uint32_t want = uint32_t{test::slow_qdq_bits(c.r, stored, bytes[value_bytes + b])} << 16;
      RC_ASSERT(f32_bits(back[e]) == want);
    }
  }
}

// Half the gap between the element grid points around |v| (0 at the largest grid point).
double half_gap(SlowRecipe r, double v) {
  const test::SlowFormat& f = test::slow_element_format(r);
  const uint32_t rank = test::slow_rank(f, v);
  if (rank > f.max_code) return 0;
  return (f.values[rank] - f.values[rank - 1]) / 2;
}

// |x - QDQ(x)| <= the recipe's bound. Derivation, for scale value s, u = x / s, r = fl32(u),
// L = 6 (E2M1) or 448 (E4M3), H(v) = half the grid gap around v:
//   |u| <= L: r stays within [-L, L] (L is a float), the element rounds r to the nearest grid
//     point, and r - u is one fp32 rounding, so
//       |x - q s| <= s H(|u|) + |x| 2^-24 + s 2^-149   (the last term: subnormal quotients).
//     When r and u straddle a grid point, r is that point and the rounding adds nothing.
//   |u| > L: the element clamps, q s = +-L s exactly, and the error is |x| - L s <= amax - L s.
//     Main KV, s normal (0x08..0x7E, t = fl32(amax / 6) <= 464): RNE to 3 mantissa bits gives
//       t / s <= 1 + 2^-4 (a tie 1.0625 * 2^e goes to the even 2^e), and amax <= 6 t / (1 - 2^-24),
//       so amax - 6 s <= 0.375 s + 6.375 s 2^-23.
//     Main KV, s subnormal k 2^-9: s >= t - 2^-10, so amax - 6 s <= 6 2^-10 (1 + 2^-22): up to
//       3 s at k = 1, which exceeds H = s, hence the separate case.
//     Main KV saturated (t > 464, s = 448): unbounded; the value is exactly +-2688.
//     Index / fp8 (ceil scales): fl32(1/6) > 1/6 and fl32(1/448) > 1/448, and s >= t, so for bf16
//       inputs |u| <= L: no clamping at all (asserted).
RC_GTEST_PROP(QdqProperty, ErrorWithinDerivedBound, ()) {
  const Case c = gen_case();
  const double lim = test::slow_element_limit(c.r);
  for (int b = 0; b < c.blocks; ++b) {
    const QuantizedBlock q = test::quantize_block(c.r, c.block(b));
    const double s = test::slow_scale_value(c.r, q.scale);
    const double amax = block_amax(c.block(b), c.n);
    const double t = test::div32(static_cast<float>(amax), 6.0f);
    for (int i = 0; i < c.n; ++i) {
      const double x = c.block(b)[i];
      const double err = std::fabs(x - static_cast<double>(q.qdq[i]));
      if (std::fabs(x) <= lim * s) {
        const double bound = s * half_gap(c.r, std::fabs(x) / s) + std::fabs(x) * 0x1p-24 +
                             s * 0x1p-149;
        RC_ASSERT(err <= bound);
        continue;
      }
      RC_ASSERT(c.r == SlowRecipe::kCompressedKv);  // ceil scales never clamp
      RC_ASSERT(static_cast<double>(q.qdq[i]) == std::copysign(lim * s, x));
      double allowed = std::numeric_limits<double>::infinity();            // saturated scale
      if (t <= 464.0) allowed = q.scale >= 0x08 ? s * (0.375 + 6.375 * 0x1p-23)  // normal scale
                                                : 6 * 0x1p-10 * (1 + 0x1p-22);   // subnormal
      RC_ASSERT(std::fabs(x) - lim * s <= allowed);
    }
  }
}

// Where the block maximum lands. Main KV, normal scale (>= 0x08, so the floor is inactive): RNE
// of the scale is within 2^-4, amax / s >= 6 / 1.0625 > 5, so the max encodes to +-6 (0x7/0xF).
// E8M0 ceil scales with the floor inactive: amax / s in (L/2, L], so the FP4 max code is 5, 6 or
// 7 (3, 4, 6) and the FP8 max code is 0x76 (224) .. 0x7E (448).
RC_GTEST_PROP(QdqProperty, BlockMaxLandsOnTopCodes, ()) {
  const Case c = gen_case();
  const double lim = test::slow_element_limit(c.r);
  int checked = 0;
  for (int b = 0; b < c.blocks; ++b) {
    const QuantizedBlock q = test::quantize_block(c.r, c.block(b));
    const double amax = block_amax(c.block(b), c.n);
    const double s = test::slow_scale_value(c.r, q.scale);
    bool floor_active = false;
    switch (c.r) {
      case SlowRecipe::kCompressedKv: floor_active = q.scale < 0x08; break;
      case SlowRecipe::kIndex: floor_active = amax <= std::ldexp(6.0, -126); break;
      case SlowRecipe::kFp8: floor_active = amax <= test::slow_fp8_floor(); break;
    }
    if (floor_active) continue;
    ++checked;
    if (c.r != SlowRecipe::kCompressedKv) RC_ASSERT(amax / s > lim / 2 && amax / s <= lim);
    for (int i = 0; i < c.n; ++i) {
      if (std::fabs(static_cast<double>(c.block(b)[i])) != amax) continue;
      const uint8_t mag = q.codes[i] & static_cast<uint8_t>(sign_bit(c.r) - 1);
      switch (c.r) {
        case SlowRecipe::kCompressedKv: RC_ASSERT(mag == 0x7); break;
        case SlowRecipe::kIndex: RC_ASSERT(mag >= 0x5 && mag <= 0x7); break;
        case SlowRecipe::kFp8: RC_ASSERT(mag >= 0x76 && mag <= 0x7E); break;
      }
    }
  }
  RC_CLASSIFY(checked == 0, "every block floored (nothing to check)");
}

// Within one block (one scale): x_i <= x_j implies QDQ_i <= QDQ_j and decoded codes ordered.
RC_GTEST_PROP(QdqProperty, BlockQdqIsMonotonic, ()) {
  const Case c = gen_case();
  for (int b = 0; b < c.blocks; ++b) {
    const QuantizedBlock q = test::quantize_block(c.r, c.block(b));
    for (int i = 0; i < c.n; ++i) {
      for (int j = 0; j < c.n; ++j) {
        if (!(c.block(b)[i] <= c.block(b)[j])) continue;
        RC_ASSERT(q.qdq[i] <= q.qdq[j]);
        RC_ASSERT(test::slow_element_value(c.r, q.codes[i]) <=
                  test::slow_element_value(c.r, q.codes[j]));
      }
    }
  }
}

// Negating a block keeps the scale and flips exactly the sign bit of every code and QDQ value.
RC_GTEST_PROP(QdqProperty, BlockIsSignSymmetric, ()) {
  const Case c = gen_case();
  std::vector<float> neg;
  for (const float v : c.x) neg.push_back(-v);
  for (int b = 0; b < c.blocks; ++b) {
    const QuantizedBlock p = test::quantize_block(c.r, c.block(b));
    const QuantizedBlock m = test::quantize_block(c.r, neg.data() + static_cast<size_t>(b) * c.n);
    RC_ASSERT(p.scale == m.scale);
    for (int i = 0; i < c.n; ++i) {
      RC_ASSERT(m.codes[i] == (p.codes[i] ^ sign_bit(c.r)));
      RC_ASSERT(f32_bits(m.qdq[i]) == (f32_bits(p.qdq[i]) ^ 0x80000000u));
    }
  }
}

// The scalar codecs, each with its decoder and sign bit (0 for the unsigned E8M0).
struct ScalarCodec {
  const char* name;
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
  uint32_t sign;
};
const ScalarCodec kScalarCodecs[] = {
    {"e2m1", [](float x) -> uint32_t { return e2m1_encode(x); }, e2m1_decode, 0x8},
    {"e4m3 satfinite", [](float x) -> uint32_t { return e4m3_encode_satfinite(x); }, e4m3_decode,
     0x80},
    {"e4m3 kSpecial",
     [](float x) { return E4M3::encode<Round::kNearestEven, Overflow::kSpecial>(x); },
     e4m3_decode, 0x80},
    {"e8m0 ceil", [](float x) -> uint32_t { return e8m0_encode_ceil(x); }, e8m0_decode, 0},
    {"bf16", [](float x) -> uint32_t { return bf16_encode(x); }, bf16_decode, 0x8000},
};

float gen_non_nan() {
  return *rc::gen::suchThat(test::gen_scalar_float(), [](float v) { return !std::isnan(v); });
}

// x <= y implies decode(encode(x)) <= decode(encode(y)) (|x| <= |y| for the unsigned E8M0);
// the NaN that kSpecial gives on overflow is unordered and skipped.
RC_GTEST_PROP(ScalarEncoderProperty, IsMonotonic, ()) {
  float x = gen_non_nan();
  float y = gen_non_nan();
  if (y < x) std::swap(x, y);
  for (const ScalarCodec& c : kScalarCodecs) {
    const float a = c.sign == 0 ? std::fmin(std::fabs(x), std::fabs(y)) : x;
    const float b = c.sign == 0 ? std::fmax(std::fabs(x), std::fabs(y)) : y;
    const float da = c.decode(c.encode(a));
    const float db = c.decode(c.encode(b));
    if (std::isnan(da) || std::isnan(db)) continue;
    RC_ASSERT(da <= db);
  }
}

// encode(-x) == encode(x) ^ sign bit for every non-NaN x, zeros and infinities included.
RC_GTEST_PROP(ScalarEncoderProperty, IsSignSymmetric, ()) {
  const float x = gen_non_nan();
  for (const ScalarCodec& c : kScalarCodecs) RC_ASSERT(c.encode(-x) == (c.encode(x) ^ c.sign));
}

// Scalar QDQ is idempotent: encode(decode(encode(x))) == encode(x) for non-NaN codes.
RC_GTEST_PROP(ScalarEncoderProperty, QdqIsIdempotent, ()) {
  const float x = gen_non_nan();
  for (const ScalarCodec& c : kScalarCodecs) {
    const uint32_t code = c.encode(x);
    if (std::isnan(c.decode(code))) continue;
    RC_ASSERT(c.encode(c.decode(code)) == code);
  }
}

}  // namespace
}  // namespace dsv41::formats
