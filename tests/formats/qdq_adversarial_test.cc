// Adversarial blocks for the block recipes of formats/qdq.h: the literal golden blocks of
// research/numerics.md §10, exact E2M1 and E4M3 ties, zeros and signed zeros, subnormals, bf16
// max and scale saturation, mixed signs and the amax floors. Every block is also checked against
// the independent slow recipe (tests/support/slow_recipes.h) bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "formats/qdq.h"
#include "tests/support/recipe_under_test.h"
#include "tests/support/slow_recipes.h"

namespace dsv41::formats {
namespace {

using test::QuantizedBlock;
using test::SlowRecipe;

// Pads x with zeros to the recipe's block, checks it against the slow recipe and returns what
// formats/ produced.
QuantizedBlock expect_slow_equal(SlowRecipe r, std::vector<float> x) {
  const int n = test::slow_block_size(r);
  EXPECT_LE(static_cast<int>(x.size()), n);
  x.resize(n, 0.0f);
  const QuantizedBlock got = test::quantize_block(r, x.data());
  const test::SlowBlock want = test::slow_quantize(r, x.data());
  EXPECT_TRUE(got.finite) << test::slow_recipe_name(r);
  EXPECT_EQ(got.scale, want.scale) << test::slow_recipe_name(r) << " x[0]=" << x[0];
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(got.codes[i], want.codes[i]) << test::slow_recipe_name(r) << " x[" << i
                                           << "]=" << x[i];
    EXPECT_EQ(f32_bits(got.qdq[i]), uint32_t{want.qdq[i]} << 16)
        << test::slow_recipe_name(r) << " x[" << i << "]=" << x[i];
  }
  return got;
}

// research/numerics.md §10: the main KV block with an inexact scale (amax 1 -> t = fl32(1/6)).
TEST(QdqAdversarial, CompressedKvGoldenBlockFromNumericsNotes) {
  const std::vector<float> x = {1, -0.5f, 0.25f, 0.171875f, 0.0859375f, -std::ldexp(1.0f, -10),
                                0, -0.0f, 0.75f, 0.6015625f, 0.40234375f, 0.19921875f,
                                0.099609375f, 0.050048828125f, 0.8984375f, -1};
  const QuantizedBlock b = expect_slow_equal(SlowRecipe::kCompressedKv, x);
  EXPECT_EQ(b.scale, 0x23);
  const std::vector<uint8_t> codes = {0x7, 0xd, 0x3, 0x2, 0x1, 0x8, 0x0, 0x8,
                                      0x6, 0x6, 0x4, 0x2, 0x1, 0x1, 0x7, 0xf};
  EXPECT_EQ(b.codes, codes);
  EXPECT_EQ(b.qdq[0], 1.03125f);  // the block max is overshot by 3%
}

// research/numerics.md §10: indexer (E8M0 ceil) and window FP8 (ue8m0) scales.
TEST(QdqAdversarial, E8m0GoldenScalesFromNumericsNotes) {
  struct Case {
    SlowRecipe r;
    float amax;
    uint8_t scale;
    uint8_t code_of_amax;
  };
  const Case cases[] = {
      {SlowRecipe::kIndex, 3.0f, 0x7E, 0x7},       {SlowRecipe::kIndex, 3.015625f, 0x7F, 0x5},
      {SlowRecipe::kIndex, 6.0f, 0x7F, 0x7},       {SlowRecipe::kIndex, 1e-38f, 0x01, 0x2},
      {SlowRecipe::kFp8, 448.0f, 0x7F, 0x7E},      {SlowRecipe::kFp8, 1.0f, 0x77, 0x78},
      {SlowRecipe::kFp8, 1e-5f, 0x69, 0x62},       {SlowRecipe::kFp8, 3000.0f, 0x82, 0x7C},
  };
  for (const Case& c : cases) {
    const QuantizedBlock b = expect_slow_equal(c.r, {c.amax, -c.amax / 2});
    EXPECT_EQ(b.scale, c.scale) << c.amax;
    EXPECT_EQ(b.codes[0], c.code_of_amax) << c.amax;
  }
}

// Exact E2M1 ties at scale 2^k: element 0 = 6 * 2^k makes both FP4 scale rules give exactly 2^k;
// the midpoints 0.25 .. 5 round to the even code (numerics.md §0.1: 0.25->0, 0.75->1, 1.25->1,
// 1.75->2, 2.5->2, 3.5->4, 5->4), both signs.
TEST(QdqAdversarial, E2m1TiesRoundToEvenAtEveryPowerOfTwoScale) {
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t want[] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};
  struct Range {
    SlowRecipe r;
    int k_lo, k_hi;  // exponents whose scale 2^k the recipe produces exactly
  };
  // Main KV: E4M3 holds 2^-9 .. 2^8. Index: the floor is 6 * 2^-126; 6 * 2^125 < FLT_MAX.
  for (const Range& range : {Range{SlowRecipe::kCompressedKv, -9, 8}, Range{SlowRecipe::kIndex, -126, 125}}) {
    for (int k = range.k_lo; k <= range.k_hi; ++k) {
      std::vector<float> x = {std::ldexp(6.0f, k)};
      for (const float m : mids) {
        x.push_back(std::ldexp(m, k));
        x.push_back(-std::ldexp(m, k));
      }
      const QuantizedBlock b = expect_slow_equal(range.r, x);
      const uint32_t scale =
          range.r == SlowRecipe::kCompressedKv
              ? test::slow_encode(test::slow_e4m3(), test::kE4m3Saturate, std::ldexp(1.0f, k))
              : static_cast<uint32_t>(k + 127);
      ASSERT_EQ(b.scale, scale) << "k=" << k;
      for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(b.codes[1 + 2 * i], want[i]) << "k=" << k << " mid " << mids[i];
        EXPECT_EQ(b.codes[2 + 2 * i], want[i] | 0x8) << "k=" << k << " mid -" << mids[i];
      }
    }
  }
}

// The main KV elements need the IEEE division x / s: s is not a power of two. For bf16 inputs the
// only scales where fl32(x / s) and fl32(x * fl32(1/s)) round an E2M1 tie differently are those
// with mantissa 1.875 (codes 0x0F, 0x17, ..., 0x77), at the ties 1.25, 2.5 and 5, which must round
// down to the even codes 1.0, 2.0 and 4.0 (x * (1/s) lands just above the tie and rounds up).
TEST(QdqAdversarial, CompressedKvTiesAtScaleMantissa1875NeedDivision) {
  for (int k = -5; k <= 7; ++k) {
    const float s = std::ldexp(1.875f, k);  // E4M3 code (k + 7) << 3 | 7
    const std::vector<float> x = {6 * s, 1.25f * s, -2.5f * s, 5 * s, 0.25f * s};
    const QuantizedBlock b = expect_slow_equal(SlowRecipe::kCompressedKv, x);
    ASSERT_EQ(b.scale, ((k + 7) << 3) | 7) << "k=" << k;
    EXPECT_EQ(b.codes[1], 0x2) << "k=" << k;  // 1.25 -> 1.0
    EXPECT_EQ(b.codes[2], 0xC) << "k=" << k;  // -2.5 -> -2.0
    EXPECT_EQ(b.codes[3], 0x6) << "k=" << k;  // 5 -> 4.0
    EXPECT_EQ(b.codes[4], 0x0) << "k=" << k;  // 0.25 -> 0
  }
}

// Exact E4M3 ties at FP8 scale 1 (amax 400 -> t = fl32(400 * fl32(1/448)) < 1 -> 2^0): every
// midpoint between neighbouring E4M3 values below 400 goes to the even code.
TEST(QdqAdversarial, E4m3TiesRoundToEvenAtScaleOne) {
  const test::SlowFormat& e4m3 = test::slow_e4m3();
  std::vector<std::pair<float, uint8_t>> ties;  // midpoint, the even neighbour's code
  for (uint32_t c = 0; e4m3.values[c + 1] <= 400.0; ++c) {
    ties.emplace_back(static_cast<float>(e4m3.mids[c]), static_cast<uint8_t>(c + (c & 1u)));
  }
  ASSERT_GT(ties.size(), 100u);
  for (size_t start = 0; start < ties.size(); start += 31) {
    std::vector<float> x = {400.0f};
    for (size_t i = start; i < std::min(start + 31, ties.size()); ++i) x.push_back(ties[i].first);
    const QuantizedBlock b = expect_slow_equal(SlowRecipe::kFp8, x);
    ASSERT_EQ(b.scale, 0x7F);
    for (size_t i = 1; i < x.size(); ++i) {
      EXPECT_EQ(b.codes[i], ties[start + i - 1].second) << "midpoint " << x[i];
    }
  }
}

TEST(QdqAdversarial, AllZeroBlocks) {
  const struct {
    SlowRecipe r;
    uint8_t scale;
  } cases[] = {{SlowRecipe::kCompressedKv, 0x01}, {SlowRecipe::kIndex, 0x01}, {SlowRecipe::kFp8, 0x69}};
  for (const auto& c : cases) {
    const QuantizedBlock b = expect_slow_equal(c.r, {});
    EXPECT_EQ(b.scale, c.scale) << test::slow_recipe_name(c.r);  // floors: never a zero scale
    for (size_t i = 0; i < b.codes.size(); ++i) {
      EXPECT_EQ(b.codes[i], 0);
      EXPECT_EQ(f32_bits(b.qdq[i]), 0u);
    }
  }
}

// -0 keeps its sign through code and QDQ; so do values that round to zero.
TEST(QdqAdversarial, SignedZerosSurvive) {
  for (const SlowRecipe r : test::kAllSlowRecipes) {
    const float tiny = std::ldexp(1.0f, -133);  // the smallest bf16 subnormal
    const QuantizedBlock b = expect_slow_equal(r, {1.0f, -0.0f, 0.0f, -tiny, tiny});
    const uint8_t neg_zero = r == SlowRecipe::kFp8 ? 0x80 : 0x8;
    EXPECT_EQ(b.codes[1], neg_zero);
    EXPECT_EQ(b.codes[2], 0);
    EXPECT_EQ(b.codes[3], neg_zero);
    EXPECT_EQ(b.codes[4], 0);
    EXPECT_EQ(f32_bits(b.qdq[1]), 0x80000000u);
    EXPECT_EQ(f32_bits(b.qdq[3]), 0x80000000u);
  }
}

// Blocks of bf16 subnormals only (amax below every floor) and subnormals beside a normal.
TEST(QdqAdversarial, SubnormalBlocks) {
  for (const SlowRecipe r : test::kAllSlowRecipes) {
    const int n = test::slow_block_size(r);
    for (uint32_t start = 1; start < 0x80; start += n / 2) {
      std::vector<float> x;
      for (int i = 0; i < n; ++i) {
        x.push_back(test::bf16_to_float((start + i) % 0x80 | (i % 3 == 0 ? 0x8000u : 0u)));
      }
      expect_slow_equal(r, x);
      x[5] = test::bf16_to_float(0x0080);  // the smallest bf16 normal, 2^-126
      expect_slow_equal(r, x);
    }
  }
}

// bf16 max (3.39e38 = 1.99 * 2^127): main KV scale saturates at 448 (0x7E) and elements clamp
// to +-6. The E8M0 scales stay finite (t < 2^127), but the QDQ value overflows: index
// s = 2^126 and max / s = 3.98 -> code 4.0, 4 * 2^126 = 2^128; fp8 s = 2^120 and 255 -> 256,
// 256 * 2^120 = 2^128. Both give +-Inf, as the official code does (kernels.h5 quant/allbits_seq
// row 1019 holds 0x7F80 there), so dequantization is not exact for |x| >= 1.75 * 2^127 (index)
// and >= 1.9375 * 2^127 (fp8).
TEST(QdqAdversarial, HugeBlocksSaturateOrOverflow) {
  const float max = test::bf16_to_float(0x7F7F);
  const struct {
    SlowRecipe r;
    uint8_t scale;
  } cases[] = {{SlowRecipe::kCompressedKv, 0x7E}, {SlowRecipe::kIndex, 0xFD}, {SlowRecipe::kFp8, 0xF7}};
  for (const auto& c : cases) {
    const QuantizedBlock b = expect_slow_equal(c.r, {max, -max, 1.0f, -1e30f, max / 3});
    EXPECT_EQ(b.scale, c.scale) << test::slow_recipe_name(c.r);
    EXPECT_EQ(b.qdq[0], -b.qdq[1]);
    if (c.r == SlowRecipe::kCompressedKv) {
      EXPECT_EQ(b.codes[0], 0x7);  // clamped to 6
      EXPECT_EQ(b.qdq[0], 2688.0f);
    } else {
      EXPECT_EQ(b.qdq[0], HUGE_VALF) << test::slow_recipe_name(c.r);
    }
  }
}

// Main KV amax around the E4M3 saturation edge: t = 448 exactly, 464 (tie -> 448), beyond.
TEST(QdqAdversarial, CompressedKvScaleSaturationEdge) {
  for (const float amax : {2688.0f, 2752.0f, 2784.0f, 2816.0f, 3072.0f, 65536.0f}) {
    const QuantizedBlock b = expect_slow_equal(SlowRecipe::kCompressedKv, {-amax, amax / 2, 2688.0f});
    EXPECT_EQ(b.scale, 0x7E);  // t = 448, 458.7 (-> 448), 464 (tie -> 448), beyond: saturated
    EXPECT_EQ(b.codes[0], 0xF);
    EXPECT_EQ(b.qdq[0], -2688.0f);
  }
}

// Mixed signs and magnitudes spread over many binades, for each recipe.
TEST(QdqAdversarial, MixedSignsAndSpreads) {
  for (const SlowRecipe r : test::kAllSlowRecipes) {
    for (int e = -40; e <= 40; e += 5) {
      std::vector<float> x;
      for (int i = 0; i < test::slow_block_size(r); ++i) {
        const float m = test::bf16_to_float(0x3F80u + static_cast<uint32_t>(i * 37 % 128));
        x.push_back(std::ldexp(i % 2 ? -m : m, e - i % 9));
      }
      expect_slow_equal(r, x);
    }
  }
}

// amax exactly at each floor and at its bf16 neighbours: below, the floor sets the scale.
TEST(QdqAdversarial, AmaxAtTheFloors) {
  const struct {
    SlowRecipe r;
    uint16_t floor_bits;  // a bf16 pattern at (or next to) the floor
    uint8_t floor_scale;
  } cases[] = {{SlowRecipe::kCompressedKv, 0x3C40, 0x01},  // 6 * 2^-9 exactly
               {SlowRecipe::kIndex, 0x01C0, 0x01},   // 6 * 2^-126 exactly
               {SlowRecipe::kFp8, 0x38D1, 0x69}};    // just below fl32(1e-4)
  for (const auto& c : cases) {
    for (int d = -3; d <= 3; ++d) {
      const float amax = test::bf16_to_float(c.floor_bits + d);
      const QuantizedBlock b = expect_slow_equal(c.r, {amax / 3, -amax, amax / 2});
      if (d <= 0) {
        EXPECT_EQ(b.scale, c.floor_scale) << test::slow_recipe_name(c.r) << " d=" << d;
      }
    }
  }
}

// NaN/+-Inf at every position of an otherwise ordinary block: the raw block function returns
// false and writes the same bytes on every call (the output buffers are pre-filled differently).
// The checked API turns this into an error (cache_format_test.cc).
TEST(QdqAdversarial, NonFiniteBlocksReturnFalseDeterministically) {
  for (const SlowRecipe r : test::kAllSlowRecipes) {
    const int n = test::slow_block_size(r);
    for (const float bad : {NAN, -NAN, HUGE_VALF, -HUGE_VALF}) {
      for (int pos = 0; pos < n; ++pos) {
        std::vector<float> x(n);
        for (int i = 0; i < n; ++i) x[i] = std::ldexp(i % 2 ? -1.5f : 1.25f, i % 7 - 3);
        x[pos] = bad;
        uint8_t out[2][33];
        std::memset(out[0], 0x00, sizeof out[0]);
        std::memset(out[1], 0xFF, sizeof out[1]);
        for (auto& o : out) {
          EXPECT_FALSE(test::block_fn(r)(x.data(), &o[32], o)) << test::slow_recipe_name(r) << pos;
        }
        EXPECT_EQ(std::memcmp(out[0], out[1], n), 0) << test::slow_recipe_name(r) << " pos " << pos;
        EXPECT_EQ(out[0][32], out[1][32]) << test::slow_recipe_name(r) << " pos " << pos;
      }
    }
  }
}

// Not a bug: the official main KV recipe is not idempotent when the E4M3 scale is subnormal and
// the block max does not land on code 7. amax = 9 * 2^-9 gives t = 1.5 * 2^-9, a tie that rounds
// to s = 2^-8; amax / s = 4.5 rounds to 4, so the QDQ max is 2^-6. Quantizing that again gives
// t = 2^-6 / 6 = 1.33 * 2^-9 -> s = 2^-9, 2^-6 / s = 8 clamps to 6: the value becomes 6 * 2^-9.
// The QDQ idempotence property (qdq_property_test.cc) therefore excludes scales 0x02..0x07.
TEST(QdqAdversarial, CompressedKvQdqNotIdempotentForSubnormalScales) {
  const QuantizedBlock once = expect_slow_equal(SlowRecipe::kCompressedKv, {std::ldexp(9.0f, -9)});
  EXPECT_EQ(once.scale, 0x02);
  EXPECT_EQ(once.codes[0], 0x6);
  EXPECT_EQ(once.qdq[0], std::ldexp(1.0f, -6));
  const QuantizedBlock twice = expect_slow_equal(SlowRecipe::kCompressedKv, {once.qdq[0]});
  EXPECT_EQ(twice.scale, 0x01);
  EXPECT_EQ(twice.codes[0], 0x7);
  EXPECT_EQ(twice.qdq[0], std::ldexp(6.0f, -9));
}

}  // namespace
}  // namespace dsv41::formats
