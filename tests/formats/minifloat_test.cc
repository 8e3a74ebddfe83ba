// Decoders of formats/minifloat.h on every code (16 E2M1, 256 E4M3, 256 E8M0, 65536 BF16)
// against values computed independently (tests/support/slow_minifloat.h: std::ldexp in double),
// the encode(decode(c)) round trip of every code, and the literal golden values of
// research/numerics.md §1 and §10 (numbers written down from CUDA/torch measurements, so they are
// independent of both the codec and the slow definition).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "tests/support/slow_minifloat.h"

namespace dsv41::formats {
namespace {

using test::float_bits;
using test::SlowFormat;

// Bits of the float equal to the double v (exact for every finite code value), or canonical NaN.
uint32_t expected_bits(double v) {
  if (std::isnan(v)) return 0x7FC00000u;
  return float_bits(static_cast<float>(v));
}

// Checks decode(c) for every code c < n_codes against slow_decode (nan_mag/inf_mag: see there).
template <typename Decode>
void check_all_codes(const SlowFormat& f, uint32_t n_codes, uint32_t nan_mag, uint32_t inf_mag,
                     Decode decode, const char* what) {
  int nonzero = 0;
  for (uint32_t c = 0; c < n_codes; ++c) {
    const double want = test::slow_decode(f, c, nan_mag, inf_mag);
    const float got = decode(c);
    ASSERT_EQ(float_bits(got), expected_bits(want))
        << what << " code 0x" << std::hex << c << " want " << want << " got " << got;
    nonzero += got != 0.0f;
  }
  EXPECT_GT(nonzero, static_cast<int>(n_codes / 2)) << what;
}

TEST(MinifloatDecode, E2m1AllCodes) {
  check_all_codes(test::slow_e2m1(), 16, 0x8, 0, E2M1::decode, "E2M1::decode");
  check_all_codes(test::slow_e2m1(), 16, 0x8, 0, e2m1_decode, "e2m1_decode");
}

TEST(MinifloatDecode, E4m3AllCodes) {
  check_all_codes(test::slow_e4m3(), 256, 0x7F, 0, E4M3::decode, "E4M3::decode");
  check_all_codes(test::slow_e4m3(), 256, 0x7F, 0, e4m3_decode, "e4m3_decode");
}

TEST(MinifloatDecode, E8m0AllCodes) {
  check_all_codes(test::slow_e8m0(), 256, 0xFF, 0, E8M0::decode, "E8M0::decode");
  check_all_codes(test::slow_e8m0(), 256, 0xFF, 0, e8m0_decode, "e8m0_decode");
  // 2^-127 is the fp32 subnormal 0x00400000, not zero (torch and CUDA agree).
  EXPECT_EQ(float_bits(e8m0_decode(0x00)), 0x00400000u);
  EXPECT_EQ(float_bits(e8m0_decode(0xFE)), 0x7F000000u);  // 2^127
}

TEST(MinifloatDecode, Bf16AllCodes) {
  check_all_codes(test::slow_bf16(), 65536, 0x7F81, 0x7F80, BF16::decode, "BF16::decode");
  // bf16_decode is a shift: a NaN keeps its payload and sign instead of becoming 0x7FC00000.
  for (uint32_t c = 0; c < 65536; ++c) {
    ASSERT_EQ(float_bits(bf16_decode(c)), c << 16) << "bf16_decode 0x" << std::hex << c;
  }
}

// The round trip of every non-NaN code (ml_dtypes' DownCasts): decode exactly, encode back.
TEST(MinifloatDecode, EncodeOfDecodeIsIdentity) {
  for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(e2m1_encode(e2m1_decode(c)), c) << c;
  for (uint32_t c = 0; c < 256; ++c) {
    if (E4M3::is_nan(c)) continue;
    EXPECT_EQ(e4m3_encode_satfinite(e4m3_decode(c)), c) << c;
    EXPECT_EQ((E4M3::encode<Round::kNearestEven, Overflow::kSpecial>(e4m3_decode(c))), c) << c;
  }
  for (uint32_t c = 0; c < 255; ++c) EXPECT_EQ(e8m0_encode_ceil(e8m0_decode(c)), c) << c;
  for (uint32_t c = 0; c < 65536; ++c) {
    if (BF16::is_nan(c)) continue;
    ASSERT_EQ(bf16_encode(bf16_decode(c)), c) << c;
  }
}

TEST(MinifloatDecode, NanAndInfPredicates) {
  int e4m3_nans = 0;
  int bf16_nans = 0;
  int bf16_infs = 0;
  for (uint32_t c = 0; c < 256; ++c) e4m3_nans += E4M3::is_nan(c);
  for (uint32_t c = 0; c < 65536; ++c) {
    bf16_nans += BF16::is_nan(c);
    bf16_infs += BF16::is_inf(c);
  }
  EXPECT_EQ(e4m3_nans, 2);                 // 0x7F, 0xFF
  EXPECT_EQ(bf16_nans, 2 * 127);           // exponent all ones, mantissa != 0
  EXPECT_EQ(bf16_infs, 2);                 // 0x7F80, 0xFF80
  EXPECT_TRUE(E8M0::is_nan(0xFF));
  for (uint32_t c = 0; c < 16; ++c) EXPECT_FALSE(E2M1::is_nan(c));
}

// research/numerics.md §10, E2M1 (fp32 input -> code).
TEST(MinifloatGolden, E2m1FromNumericsNotes) {
  const std::pair<float, uint32_t> cases[] = {
      {0.25f, 0x0}, {0.2500001f, 0x1}, {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4},
      {2.5f, 0x4},  {3.5f, 0x6},       {5.0f, 0x6},  {5.0000005f, 0x7}, {6.0f, 0x7},
      {7.0f, 0x7},  {-0.1f, 0x8},      {-0.0f, 0x8}, {HUGE_VALF, 0x7},  {NAN, 0x7},
  };
  for (const auto& [x, code] : cases) EXPECT_EQ(e2m1_encode(x), code) << x;
  // CUTLASS's table (numerics.md §1): E2M1 code -> E4M3 byte of the same value.
  const uint8_t e4m3_of[16] = {0x00, 0x30, 0x38, 0x3c, 0x40, 0x44, 0x48, 0x4c,
                               0x80, 0xb0, 0xb8, 0xbc, 0xc0, 0xc4, 0xc8, 0xcc};
  for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(e4m3_encode_satfinite(e2m1_decode(c)), e4m3_of[c]);
}

// research/numerics.md §1 and §10, E4M3 SATFINITE / NOSAT.
TEST(MinifloatGolden, E4m3FromNumericsNotes) {
  struct Case {
    float x;
    uint32_t sat, nosat;
  };
  const Case cases[] = {
      {464.0f, 0x7E, 0x7E},          {465.0f, 0x7E, 0x7F},
      {-465.0f, 0xFE, 0xFF},         {std::ldexp(1.0f, -10), 0x00, 0x00},
      {std::ldexp(3.0f, -10), 0x02, 0x02}, {std::ldexp(1.0625f, -6), 0x08, 0x08},
      {std::ldexp(1.1875f, -6), 0x0A, 0x0A}, {-1e-30f, 0x80, 0x80},
      {0.16666667f, 0x23, 0x23},     {448.0f, 0x7E, 0x7E},
      {std::ldexp(1.0f, -9), 0x01, 0x01}, {HUGE_VALF, 0x7E, 0x7F},
      {-HUGE_VALF, 0xFE, 0xFF},      {NAN, 0x7F, 0x7F},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(e4m3_encode_satfinite(c.x), c.sat) << c.x;
    EXPECT_EQ((E4M3::encode<Round::kNearestEven, Overflow::kSpecial>(c.x)), c.nosat) << c.x;
  }
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_decode(0xFF)));
}

// research/numerics.md §1 and §5, E8M0 ceil (CUDA __nv_fp8_e8m0(float)) and BF16 (torch).
TEST(MinifloatGolden, E8m0AndBf16FromNumericsNotes) {
  EXPECT_EQ(e8m0_encode_ceil(1.0f), 0x7F);
  EXPECT_EQ(e8m0_encode_ceil(1.0000001f), 0x80);
  EXPECT_EQ(e8m0_encode_ceil(0.75f), 0x7F);
  EXPECT_EQ(e8m0_encode_ceil(-0.75f), 0x7F);  // |x|
  EXPECT_EQ(e8m0_encode_ceil(0.0f), 0x00);
  EXPECT_EQ(e8m0_encode_ceil(HUGE_VALF), 0xFE);
  EXPECT_EQ(e8m0_encode_ceil(NAN), 0xFF);
  EXPECT_EQ(bf16_encode(1.0f), 0x3F80);
  EXPECT_EQ(bf16_encode(test::float_from(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(bf16_encode(test::float_from(0x3F818000u)), 0x3F82);  // tie -> even
  EXPECT_EQ(bf16_encode(test::float_from(0x7F7F8000u)), 0x7F80);  // max + ulp/2 -> Inf
  EXPECT_EQ(bf16_encode(-HUGE_VALF), 0xFF80);
  EXPECT_EQ(bf16_encode(-NAN), 0x7FC0);
}

// The fl32 constants of the official code, as literal bits (numerics.md §10) and as derived by
// correctly rounded double arithmetic.
TEST(MinifloatGolden, RecipeConstants) {
  EXPECT_EQ(kInv6Bits, 0x3E2AAAABu);
  EXPECT_EQ(kInv448Bits, 0x3B124925u);
  EXPECT_EQ(kFp8AmaxFloorBits, 0x38D1B717u);
  EXPECT_EQ(float_bits(test::fl32(1.0 / 6.0)), kInv6Bits);
  EXPECT_EQ(float_bits(test::fl32(1.0 / 448.0)), kInv448Bits);
  EXPECT_EQ(float_bits(1e-4f), kFp8AmaxFloorBits);
  EXPECT_EQ(test::float_from(kCompressedKvAmaxFloorBits), std::ldexp(6.0f, -9));
  EXPECT_EQ(test::float_from(kIndexAmaxFloorBits), std::ldexp(6.0f, -126));
}

}  // namespace
}  // namespace dsv41::formats
