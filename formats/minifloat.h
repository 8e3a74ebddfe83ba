// formats/minifloat.h
//
// One parametric codec, ExMy<E, M, Signed, NanInf>, for every small float dsv41 stores:
//   E2M1  (FP4 elements)         1 sign, 2 exponent, 1 mantissa, bias 1, no NaN/Inf, max 6
//   E4M3  (FP8 elements, scales) OCP "E4M3FN": bias 7, only S.1111.111 is NaN, no Inf, max 448
//   E8M0  (power-of-two scales)  unsigned, bias 127, no zero, no subnormals, 0xFF is NaN
//   BF16  (activations, caches)  IEEE-style: bias 127, Inf and NaN, max 0x7F7F
//
// Contract (host and device, C++17, no libm, no floating-point arithmetic in the codec):
//   decode(code) is exact: every finite code is a binary32 value (E8M0 0x00 decodes to the fp32
//     subnormal 2^-127 = 0x00400000, as torch and CUDA do; a flush-to-zero decoder is wrong).
//   encode<Round, Overflow>(x) rounds the binary32 value x once, in integer arithmetic:
//     Round::kNearestEven  nearest representable value, ties to the even code;
//     Round::kUp           smallest representable magnitude >= |x| (the E8M0 "ceil" scales).
//     Overflow::kSaturate  a magnitude beyond the largest finite value (after rounding) and
//                          +-Inf give +-max finite ("satfinite");
//     Overflow::kSpecial   they give Inf where the format has one (BF16, IEEE behaviour),
//                          else NaN (E4M3FN, E8M0); E2M1 has neither and always saturates.
//   Signed zero is kept: encode(-0.0f) and encode(-0.1f) in E2M1 give 0x8.
//   NaN input (the policy is explicit, per format, and matches CUDA 13 / torch):
//     E2M1 -> 0x7 (+6, CUDA's __nv_cvt_float_to_fp4), E4M3 -> 0x7F, E8M0 -> 0xFF,
//     BF16 -> 0x7FC0 (torch's c10::BFloat16). The sign of a NaN is dropped.
//   Unsigned formats (E8M0) encode |x|, as CUDA's __nv_fp8_e8m0 does.
//
// Example:
//   uint32_t c = E4M3::encode<Round::kNearestEven, Overflow::kSaturate>(465.0f);  // 0x7E (448)
//   float v = E2M1::decode(0xD);                                                    // -3.0f
#pragma once

#include <cstdint>

#include "base/base.h"

namespace dsv41::formats {

enum class NanInf : uint8_t {
  kNone,        // every code is a finite number (E2M1)
  kIeee,        // exponent all ones: mantissa 0 is Inf, anything else NaN (BF16)
  kFnAllOnes,   // "finite, NaN only": S.1111.111 is NaN, there is no Inf (E4M3FN)
  kUnsignedFF,  // unsigned, no zero and no subnormals; the all-ones code is NaN (E8M0)
};

enum class Round : uint8_t { kNearestEven, kUp };
enum class Overflow : uint8_t { kSaturate, kSpecial };

template <int kE, int kM, bool kSigned, NanInf kNI>
struct ExMy {
  static_assert(kE >= 1 && kE <= 8 && kM >= 0 && kM <= 7, "ExMy: unsupported widths");
  static constexpr int kExpBits = kE;
  static constexpr int kManBits = kM;
  static constexpr int kBits = kE + kM + (kSigned ? 1 : 0);
  static constexpr int kBias = (1 << (kE - 1)) - 1;
  // E8M0 has neither zero nor subnormals: exponent field f always means 2^(f - bias).
  static constexpr bool kHasSubnormals = kNI != NanInf::kUnsignedFF;
  static constexpr uint32_t kMagMask = (1u << (kE + kM)) - 1u;
  static constexpr uint32_t kSignBit = kSigned ? (1u << (kE + kM)) : 0u;
  static constexpr uint32_t kInfCode = kNI == NanInf::kIeee ? ((1u << kE) - 1u) << kM : 0u;
  static constexpr uint32_t kNanCode =
      kNI == NanInf::kIeee ? (kInfCode | (1u << (kM > 0 ? kM - 1 : 0))) : kMagMask;
  static constexpr uint32_t kMaxFinite =
      kNI == NanInf::kNone ? kMagMask : (kNI == NanInf::kIeee ? kInfCode - 1u : kMagMask - 1u);
  // Exponent of the smallest normal binade (for E8M0, of code 0).
  static constexpr int kEmin = kHasSubnormals ? 1 - kBias : -kBias;

  DSV41_HD static constexpr bool is_nan(uint32_t code) {
    const uint32_t m = code & kMagMask;
    return kNI == NanInf::kIeee ? m > kInfCode
                                : (kNI == NanInf::kNone ? false : m == kMagMask);
  }
  DSV41_HD static constexpr bool is_inf(uint32_t code) {
    return kNI == NanInf::kIeee && (code & kMagMask) == kInfCode;
  }

  // Exact value of a code (bits above kBits are ignored).
  DSV41_HD static float decode(uint32_t code) {
    code &= kSignBit | kMagMask;
    const uint32_t sign = (code & kSignBit) ? 1u : 0u;
    const uint32_t mag = code & kMagMask;
    if (is_nan(code)) return f32_from_bits(0x7FC00000u);
    if (is_inf(code)) return f32_from_bits((sign << 31) | 0x7F800000u);
    const uint32_t field = mag >> kM;
    const uint32_t frac = mag & ((1u << kM) - 1u);
    if (kHasSubnormals && field == 0) return f32_compose(sign, frac, kEmin - kM);
    return f32_compose(sign, (1u << kM) | frac, static_cast<int>(field) - kBias - kM);
  }

  template <Round kRound = Round::kNearestEven, Overflow kOverflow = Overflow::kSaturate>
  DSV41_HD static uint32_t encode(float x) {
    const uint32_t b = f32_bits(x);
    const uint32_t sign = kSigned && (b >> 31) ? kSignBit : 0u;
    const uint32_t abs_bits = b & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) {  // NaN: explicit per-format policy, sign dropped
      return kNI == NanInf::kNone ? kMaxFinite : kNanCode;
    }
    if (abs_bits == 0x7F800000u) return sign | overflow_code<kOverflow>();
    // |x| = sig * 2^e2 exactly.
    const uint32_t ef = abs_bits >> 23;
    const uint32_t sig = ef == 0 ? (abs_bits & 0x7FFFFFu) : ((abs_bits & 0x7FFFFFu) | 0x800000u);
    const int e2 = ef == 0 ? -149 : static_cast<int>(ef) - 150;
    if (sig == 0) return kHasSubnormals ? sign : 0u;  // E8M0 has no zero: smallest code
    const int exp = e2 + bit_length(sig) - 1;         // floor(log2 |x|)
    const int binade = exp > kEmin ? exp : kEmin;     // binades below kEmin share its quantum
    const int shift = (binade - kM) - e2;             // quantum / lsb(x) = 2^shift, shift >= 1
    uint32_t q;                                       // |x| / quantum, rounded
    if (shift >= 26) {  // |x| < quantum / 2
      q = (kRound == Round::kUp) ? 1u : 0u;
    } else {
      q = sig >> shift;
      const uint32_t rem = sig & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      if (kRound == Round::kNearestEven) {
        if (rem > half || (rem == half && (q & 1u))) ++q;
      } else if (rem != 0) {
        ++q;
      }
    }
    // q counts quanta of the binade; q == 2^(kM+1) carries into the next binade by itself.
    int64_t mag;
    if (kHasSubnormals) {
      mag = (static_cast<int64_t>(binade - kEmin) << kM) + q;
    } else {
      mag = (static_cast<int64_t>(binade - kEmin) << kM) + q - (int64_t{1} << kM);
      if (mag < 0) mag = 0;  // below 2^-127 rounds to nearest = the smallest code
    }
    if (mag > static_cast<int64_t>(kMaxFinite)) return sign | overflow_code<kOverflow>();
    return sign | static_cast<uint32_t>(mag);
  }

 private:
  template <Overflow kOverflow>
  DSV41_HD static constexpr uint32_t overflow_code() {
    if (kOverflow == Overflow::kSaturate || kNI == NanInf::kNone) return kMaxFinite;
    return kNI == NanInf::kIeee ? kInfCode : kNanCode;
  }
};

using E2M1 = ExMy<2, 1, true, NanInf::kNone>;
using E4M3 = ExMy<4, 3, true, NanInf::kFnAllOnes>;
using E8M0 = ExMy<8, 0, false, NanInf::kUnsignedFF>;
using BF16 = ExMy<8, 7, true, NanInf::kIeee>;

static_assert(E2M1::kMaxFinite == 0x7 && E2M1::kBias == 1);
static_assert(E4M3::kMaxFinite == 0x7E && E4M3::kNanCode == 0x7F && E4M3::kBias == 7);
static_assert(E8M0::kMaxFinite == 0xFE && E8M0::kNanCode == 0xFF && E8M0::kEmin == -127);
static_assert(BF16::kMaxFinite == 0x7F7F && BF16::kInfCode == 0x7F80 && BF16::kNanCode == 0x7FC0);

// Named encoders: the exact rounding each dsv41 path uses.
DSV41_HD inline uint8_t e2m1_encode(float x) {
  return static_cast<uint8_t>(E2M1::encode<Round::kNearestEven, Overflow::kSaturate>(x));
}
DSV41_HD inline uint8_t e4m3_encode_satfinite(float x) {
  return static_cast<uint8_t>(E4M3::encode<Round::kNearestEven, Overflow::kSaturate>(x));
}
DSV41_HD inline uint8_t e8m0_encode_ceil(float x) {
  return static_cast<uint8_t>(E8M0::encode<Round::kUp, Overflow::kSaturate>(x));
}
// BF16::encode<kNearestEven, kSpecial> in a few integer operations (it is on the reference's hot
// paths): a NaN gives 0x7FC0; otherwise the fp32 bits rounded to their top 16 to nearest, ties to
// even (the carry runs into the exponent exactly as rounding up does, to Inf past the largest
// finite value). The same codes for every float (MinifloatExhaustive.Bf16EncodeAllFloats).
DSV41_HD inline uint16_t bf16_encode(float x) {
  const uint32_t b = f32_bits(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
DSV41_HD inline float e2m1_decode(uint32_t c) { return E2M1::decode(c); }
DSV41_HD inline float e4m3_decode(uint32_t c) { return E4M3::decode(c); }
DSV41_HD inline float e8m0_decode(uint32_t c) { return E8M0::decode(c); }
DSV41_HD inline float bf16_decode(uint32_t c) { return f32_from_bits((c & 0xFFFFu) << 16); }
// fp32 -> bf16 -> fp32 (round to nearest even): the rounding point of every bf16 tensor.
DSV41_HD inline float round_to_bf16(float x) { return bf16_decode(bf16_encode(x)); }

}  // namespace dsv41::formats
