// Exhaustive tests of the scalar encoders of formats/minifloat.h (and formats/qdq.h's
// e8m0_ceil_official) on all 2^32 fp32 bit patterns, each against the independent slow
// definition of tests/support/slow_minifloat.h: the nearest representable value found by a
// search over the format's value set (ties to the even code), or the smallest one >= |x|,
// with the overflow/Inf/NaN policy that minifloat.h documents.
//
// Speed: positive fp32 bit patterns are ordered like their values, so each sweep walks the sorted
// value table with a moving pointer (amortised O(1) per input), evaluates the slow result once
// per magnitude and checks both signs. parallel_sweep splits the 2^31 magnitudes into fixed
// chunks over all hardware threads; the report (count, first mismatch) does not depend on the
// thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "tests/support/slow_minifloat.h"
#include "tests/support/sweep.h"

namespace dsv41::formats {
namespace {

using test::MismatchTally;
using test::SlowFormat;
using test::SlowPolicy;

constexpr uint64_t kMagnitudes = uint64_t{1} << 31;  // |x| bit patterns, +0 .. NaN 0x7FFFFFFF
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kSign = 0x80000000u;

// The slow definition's code, unchanged: what every encoder is checked against.
struct AsDefined {
  uint32_t operator()(uint32_t /*bits*/, uint32_t want) const { return want; }
};

// Checks encode(x) against the slow definition for every fp32 x (both signs of each magnitude).
// adjust(bits, want) may replace the expected code for inputs where the tested function differs
// from the definition by design.
template <typename Encode, typename Adjust = AsDefined>
MismatchTally sweep_encoder(const SlowFormat& f, const SlowPolicy& p, Encode encode,
                            Adjust adjust = {}) {
  return test::parallel_sweep(0, kMagnitudes, [&](uint64_t lo, uint64_t hi, MismatchTally& t) {
    const auto check_both = [&](uint32_t a, uint32_t want_pos, uint32_t want_neg) {
      t.check(a, adjust(a, want_pos), encode(test::float_from(a)));
      t.check(a | kSign, adjust(a | kSign, want_neg), encode(test::float_from(a | kSign)));
    };
    const uint32_t finite_end = static_cast<uint32_t>(std::min<uint64_t>(hi, kInfBits));
    uint32_t a = static_cast<uint32_t>(lo);
    if (a < finite_end) {
      uint32_t rank = test::slow_rank(f, test::float_from(a));
      for (; a < finite_end; ++a) {
        const double x = test::float_from(a);
        while (rank < f.values.size() && f.values[rank] <= x) ++rank;  // the moving pointer
        const uint32_t mag = test::slow_round_mag(f, p.round, x, rank);
        check_both(a, test::slow_apply_sign(f, p, mag, false), test::slow_apply_sign(f, p, mag, true));
      }
    }
    for (; a < hi; ++a) {  // +-Inf overflow by policy; NaN gives the NaN code, sign dropped
      if (a == kInfBits) {
        check_both(a, test::slow_apply_sign(f, p, f.overflow_index(), false),
                   test::slow_apply_sign(f, p, f.overflow_index(), true));
      } else {
        check_both(a, p.nan_code, p.nan_code);
      }
    }
  });
}

void expect_clean(const MismatchTally& t, const char* what) {
  EXPECT_EQ(t.checked, uint64_t{1} << 32) << what;
  EXPECT_EQ(t.mismatches, 0u) << t.describe(what);
  std::printf("[dsv41] %s\n", t.describe(what).c_str());
}

TEST(MinifloatExhaustive, E2m1EncodeAllFloats) {
  expect_clean(sweep_encoder(test::slow_e2m1(), test::kE2m1Policy, e2m1_encode), "e2m1_encode");
}

TEST(MinifloatExhaustive, E4m3EncodeSatfiniteAllFloats) {
  expect_clean(sweep_encoder(test::slow_e4m3(), test::kE4m3Saturate, e4m3_encode_satfinite),
               "e4m3_encode_satfinite");
}

// Overflow::kSpecial: |x| past 464 and +-Inf give the NaN code with the input's sign
// (0x7F / 0xFF, torch's non-saturating cast); NaN gives 0x7F.
TEST(MinifloatExhaustive, E4m3EncodeSpecialAllFloats) {
  const auto encode = [](float x) {
    return E4M3::encode<Round::kNearestEven, Overflow::kSpecial>(x);
  };
  expect_clean(sweep_encoder(test::slow_e4m3(), test::kE4m3Special, encode), "E4M3 kSpecial");
}

TEST(MinifloatExhaustive, E8m0EncodeCeilAllFloats) {
  expect_clean(sweep_encoder(test::slow_e8m0(), test::kE8m0Ceil, e8m0_encode_ceil),
               "e8m0_encode_ceil");
}

TEST(MinifloatExhaustive, Bf16EncodeAllFloats) {
  expect_clean(sweep_encoder(test::slow_bf16(), test::kBf16Policy, bf16_encode), "bf16_encode");
}

// e8m0_ceil_official (the bit formula of the official code: exponent field + (mantissa != 0))
// equals e8m0_encode_ceil for 0 and every normal t <= 2^127, the only t the amax floors let
// through. Both are checked against the same slow ceil (e8m0_encode_ceil by the sweep above), so
// equality follows. They differ by design elsewhere; the official byte there is:
//   0 < |t| <= 2^-127 (fp32 subnormal): 0x01 (ceil gives 0x00, the code of 2^-127 itself);
//   2^127 < |t|, +-Inf:                 0xFF (ceil saturates to 0xFE);
//   NaN:                                0x00 (0xFF + 1 wraps in the uint8_t; ceil gives 0xFF).
TEST(MinifloatExhaustive, E8m0CeilOfficialMatchesEncodeCeil) {
  constexpr uint32_t k2PowMinus127 = 0x00400000u;
  constexpr uint32_t k2Pow127 = 0x7F000000u;
  const auto documented = [](uint32_t bits, uint32_t want) -> uint32_t {
    const uint32_t a = bits & ~kSign;
    uint32_t official = want;
    if (a != 0 && a <= k2PowMinus127) official = 0x01;
    if (a > k2Pow127 && a <= kInfBits) official = 0xFF;
    if (a > kInfBits) official = 0x00;
    return official;
  };
  expect_clean(sweep_encoder(test::slow_e8m0(), test::kE8m0Ceil, e8m0_ceil_official, documented),
               "e8m0_ceil_official (slow ceil + documented differences)");
}

}  // namespace
}  // namespace dsv41::formats
