// tests/support/slow_minifloat.h
//
// An independent, slow definition of the dsv41 small floats, for exhaustive tests of
// formats/minifloat.h. Nothing here calls formats/: the value of every code comes from the
// textbook formula in double (std::ldexp), and rounding is a search over the sorted value set.
//
//   SlowFormat        the positive value set of a format, indexed by code magnitude:
//                     values[c] = value of code c for c <= max_code, plus one "virtual" value
//                     values[max_code + 1] = the value the next code would have if the exponent
//                     range went on. Rounding that lands on it is an overflow (IEEE: "overflow is
//                     decided after rounding"; 464 rounds to 448 in E4M3, not to 480).
//   SlowPolicy        what a format does with overflow, +-Inf and NaN (minifloat.h's contract).
//   slow_round_mag()  nearest value (ties to the even code) or smallest value >= |x|.
//   slow_encode()     sign + magnitude + policy, for one float.
//
// Double is exact here: every code value and every midpoint of two neighbouring values has at
// most 10 significant bits, and every float converts to double exactly, so all comparisons are
// exact comparisons of real numbers.
//
// Example:
//   const SlowFormat& e4m3 = slow_e4m3();
//   uint32_t code = slow_encode(e4m3, kE4m3Saturate, 465.0f);  // 0x7E
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

namespace dsv41::test {

enum class SlowRound : uint8_t { kNearestEven, kUp };

struct SlowFormat {
  int exp_bits = 0;
  int man_bits = 0;
  int bias = 0;
  bool has_subnormals = true;  // false: field 0 is a normal binade (E8M0)
  bool is_signed = true;
  uint32_t max_code = 0;       // largest finite code magnitude
  std::vector<double> values;  // [max_code + 2] value of code c; last entry virtual (overflow)
  std::vector<double> mids;    // [max_code + 1] (values[c] + values[c + 1]) / 2, exact

  // Textbook value of code magnitude c (any c, also beyond max_code).
  double formula(uint32_t c) const {
    const int field = static_cast<int>(c >> man_bits);
    const double frac = static_cast<double>(c & ((1u << man_bits) - 1u));
    if (has_subnormals && field == 0) return std::ldexp(frac, 1 - bias - man_bits);
    return std::ldexp(std::ldexp(1.0, man_bits) + frac, field - bias - man_bits);
  }

  SlowFormat(int e, int m, int b, bool subnormals, bool sign, uint32_t max)
      : exp_bits(e), man_bits(m), bias(b), has_subnormals(subnormals), is_signed(sign),
        max_code(max) {
    for (uint32_t c = 0; c <= max_code + 1; ++c) values.push_back(formula(c));
    for (uint32_t c = 0; c <= max_code; ++c) {
      if (!(values[c] < values[c + 1])) throw std::logic_error("SlowFormat: values not sorted");
      mids.push_back((values[c] + values[c + 1]) / 2);
    }
  }

  uint32_t sign_bit() const { return is_signed ? 1u << (exp_bits + man_bits) : 0u; }
  uint32_t overflow_index() const { return max_code + 1; }
};

// Formats by definition (OCP MX / OFP8, IEEE bfloat16); see numerics.md §1.
inline const SlowFormat& slow_e2m1() {
  static const SlowFormat f(2, 1, 1, true, true, 0x7);  // {0, .5, 1, 1.5, 2, 3, 4, 6}
  return f;
}
inline const SlowFormat& slow_e4m3() {
  static const SlowFormat f(4, 3, 7, true, true, 0x7E);  // 0x7F is NaN; max 448
  return f;
}
inline const SlowFormat& slow_e8m0() {
  static const SlowFormat f(8, 0, 127, false, false, 0xFE);  // 2^-127 .. 2^127; 0xFF NaN
  return f;
}
inline const SlowFormat& slow_bf16() {
  static const SlowFormat f(8, 7, 127, true, true, 0x7F7F);  // 0x7F80 Inf, above NaN
  return f;
}

// Number of table values <= x: the moving pointer of a sweep, or a fresh binary search.
inline uint32_t slow_rank(const SlowFormat& f, double x) {
  return static_cast<uint32_t>(std::upper_bound(f.values.begin(), f.values.end(), x) -
                               f.values.begin());
}

// Rounds the magnitude x >= 0 (finite), given rank = slow_rank(f, x). Returns the code
// magnitude, or f.overflow_index() when the rounded value is beyond the largest finite one.
inline uint32_t slow_round_mag(const SlowFormat& f, SlowRound mode, double x, uint32_t rank) {
  const uint32_t over = f.overflow_index();
  if (mode == SlowRound::kUp) {
    if (rank > 0 && f.values[rank - 1] == x) return rank - 1;
    return std::min(rank, over);  // smallest value > x; rank == over + 1 also overflows
  }
  if (rank == 0) return 0;  // below the smallest value (E8M0 only): nearest is code 0
  const uint32_t lo = rank - 1;
  if (lo >= over) return over;
  if (f.values[lo] == x) return lo;
  const double mid = f.mids[lo];
  if (x < mid) return lo;
  if (x > mid) return lo + 1;
  return (lo & 1u) == 0 ? lo : lo + 1;  // tie: the even code
}

// Overflow, Inf and NaN policy of one encoder (formats/minifloat.h header contract).
struct SlowPolicy {
  SlowRound round;
  uint32_t overflow_code;  // magnitude code for |x| past the range and for +-Inf
  uint32_t nan_code;       // the whole code for NaN (its sign is dropped)
};

inline constexpr SlowPolicy kE2m1Policy{SlowRound::kNearestEven, 0x7, 0x7};  // sat; NaN -> +6
inline constexpr SlowPolicy kE4m3Saturate{SlowRound::kNearestEven, 0x7E, 0x7F};
inline constexpr SlowPolicy kE4m3Special{SlowRound::kNearestEven, 0x7F, 0x7F};  // NaN, signed
inline constexpr SlowPolicy kE8m0Ceil{SlowRound::kUp, 0xFE, 0xFF};
inline constexpr SlowPolicy kBf16Policy{SlowRound::kNearestEven, 0x7F80, 0x7FC0};  // -> Inf

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_from(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The float whose bits are the bf16 pattern b (bf16 is the top half of a binary32).
inline float bf16_to_float(uint32_t b) { return float_from((b & 0xFFFFu) << 16); }
inline bool bf16_is_finite(uint32_t b) { return (b & 0x7F80u) != 0x7F80u; }

// The whole code of a magnitude code for an input whose sign bit is `negative`.
inline uint32_t slow_apply_sign(const SlowFormat& f, const SlowPolicy& p, uint32_t mag,
                                bool negative) {
  const uint32_t code = mag >= f.overflow_index() ? p.overflow_code : mag;
  return negative ? code | f.sign_bit() : code;
}

// Encodes the real number (negative ? -m : m), m >= 0 finite (a double, so that exact
// products can be rounded once).
inline uint32_t slow_encode_real(const SlowFormat& f, const SlowPolicy& p, double m,
                                 bool negative) {
  return slow_apply_sign(f, p, slow_round_mag(f, p.round, m, slow_rank(f, m)), negative);
}

// Encodes one float.
inline uint32_t slow_encode(const SlowFormat& f, const SlowPolicy& p, float x) {
  const uint32_t b = float_bits(x);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return p.nan_code;
  const bool negative = (b >> 31) != 0;
  if (a == 0x7F800000u) return slow_apply_sign(f, p, f.overflow_index(), negative);
  return slow_encode_real(f, p, std::fabs(static_cast<double>(x)), negative);
}

// Exact value of a whole code (NaN for NaN codes, +-Inf for BF16 Inf).
inline double slow_decode(const SlowFormat& f, uint32_t code, uint32_t nan_mag,
                          uint32_t inf_mag) {
  const uint32_t mag = code & (f.sign_bit() == 0 ? 0xFFu : f.sign_bit() - 1u);
  const bool negative = (code & f.sign_bit()) != 0;
  double v;
  if (inf_mag != 0 && mag == inf_mag) {
    v = std::numeric_limits<double>::infinity();
  } else if (mag >= nan_mag) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else {
    v = f.values[mag];
  }
  return negative ? -v : v;
}

// fl32(d): d rounded to the nearest float, ties to even, overflowing to +-Inf as IEEE does.
// (float)d is that rounding for every d inside the float range; outside it the cast is
// undefined behaviour, so the range is decided here.
inline float fl32(double d) {
  const double max = static_cast<double>(std::numeric_limits<float>::max());
  const double inf_threshold = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);  // max + ulp/2
  if (std::fabs(d) >= inf_threshold) return d > 0 ? HUGE_VALF : -HUGE_VALF;
  if (std::fabs(d) > max) return static_cast<float>(d > 0 ? max : -max);
  return static_cast<float>(d);
}

// fl32(a / b) for floats a, b: the double quotient is rounded once more to float. Rounding
// twice is harmless here because binary64 has more than 2*24 + 2 bits (Figueroa), so this is
// the correctly rounded IEEE binary32 quotient.
inline float div32(float a, float b) {
  return fl32(static_cast<double>(a) / static_cast<double>(b));
}
// fl32(a * b): the double product of two floats is exact.
inline float mul32(float a, float b) {
  return fl32(static_cast<double>(a) * static_cast<double>(b));
}

}  // namespace dsv41::test
