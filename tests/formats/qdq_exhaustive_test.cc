// The block recipes of formats/qdq.h (quantize_compressed_kv_block, quantize_index_block,
// quantize_fp8_block) and their dequantizers, with every one of the 2^16 bf16 patterns placed in
// blocks, against the independent slow recipes of tests/support/slow_recipes.h.
//
// Block layout (one block per (pattern v, anchor)):
//   [0]      the anchor: sets the scale when |anchor| >= |v| (each anchor names the path it covers)
//   [1]      v
//   [2..]    companions of v, all of magnitude <= |v|: -v, the bf16 neighbour toward zero, v/2^k
//            (exponent field lowered), +-0 -- so amax = max(|anchor|, |v|) exactly.
// With anchor 0 the pattern itself is the block maximum: every bf16 amax reaches the scale rule.
//
// Finite v: scale byte, every element code, the return value and the bf16 QDQ bits must equal the
// slow definition. Non-finite v (NaN, +-Inf): the function must return false and write the same
// bytes on every call.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "formats/qdq.h"
#include "tests/support/recipe_under_test.h"
#include "tests/support/slow_recipes.h"
#include "tests/support/sweep.h"

namespace dsv41::formats {
namespace {

using test::MismatchTally;
using test::SlowRecipe;

struct Anchor {
  uint16_t bits;
  const char* path;
};

// bf16 anchors; the comment says which scale path each one exercises.
constexpr Anchor kAnchors[] = {
    {0x0000, "v is the amax: every bf16 amax through every scale rule"},
    {0x3F80, "amax 1.0: main KV scale 0x23 (inexact 1/6), index 2^-2, fp8 2^-8"},
    {0x40C0, "amax 6: power-of-two scales 1 (main KV, index), FP4 grid at scale 1"},
    {0x4134, "amax 11.25: main KV scale 1.875 (0x3F), where x / s and x * (1/s) split E2M1 ties"},
    {0x4040, "amax 3: index scale 2^-1, E2M1 code 7 at t = 0.5 exactly"},
    {0x43E0, "amax 448: fp8 scale 1, E4M3 grid at scale 1"},
    {0x4528, "amax 2688 = 6 * 448: main KV t = 448, the top scale 0x7E (saturated above)"},
    {0x38D1, "amax just below fl32(1e-4): fp8 floor active"},
    {0x3C40, "amax 6 * 2^-9: main KV floor, scale 0x01 (E4M3 subnormal)"},
    {0x3C90, "amax 9 * 2^-9: main KV t = 1.5 * 2^-9, an E4M3 subnormal tie -> scale 0x02"},
    {0x01C0, "amax 6 * 2^-126: index floor, scale 0x01"},
    {0x7F7F, "amax bf16 max: main KV scale saturated; E8M0 QDQ of the max overflows to Inf"},
};

// Companion k >= 2 of v (magnitude <= |v|).
uint16_t companion(uint16_t v, int k) {
  const uint16_t sign = v & 0x8000u;
  const uint16_t mag = v & 0x7FFFu;
  switch (k % 6) {
    case 2: return v ^ 0x8000u;                                           // -v
    case 3: return mag == 0 ? v : static_cast<uint16_t>(v - 1);            // toward zero
    case 4: return 0x0000;                                                 // +0
    case 5: return 0x8000;                                                 // -0
    default: {                                                             // v / 2^j, sign flips
      const int j = k / 6 + 1;
      const uint16_t field = mag >> 7;
      const uint16_t m = field > j ? static_cast<uint16_t>(mag - (j << 7)) : (mag >> j);
      return static_cast<uint16_t>((k % 12 < 6 ? sign : sign ^ 0x8000u) | m);
    }
  }
}

std::vector<float> make_block(uint16_t anchor, uint16_t v, int n) {
  std::vector<float> x(n);
  x[0] = test::bf16_to_float(anchor);
  x[1] = test::bf16_to_float(v);
  for (int k = 2; k < n; ++k) x[k] = test::bf16_to_float(companion(v, k));
  return x;
}

// Checks one block against the slow recipe; key identifies (anchor, v) in reports.
void check_block(SlowRecipe r, const std::vector<float>& x, uint64_t key, MismatchTally& t,
                 uint64_t& nonzero) {
  const test::QuantizedBlock got = test::quantize_block(r, x.data());
  const test::SlowBlock want = test::slow_quantize(r, x.data());
  t.check(key, 1, got.finite, "return value");
  t.check(key, want.scale, got.scale, "scale byte");
  for (size_t i = 0; i < got.codes.size(); ++i) {
    t.check(key, want.codes[i], got.codes[i], "element code");
    const uint32_t q = f32_bits(got.qdq[i]);
    t.check(key, uint64_t{want.qdq[i]} << 16, q, "qdq bits (fp32)");
    nonzero += (q & 0x7FFFFFFFu) != 0;
  }
}

// Non-finite block: returns false, and two calls (into differently pre-filled buffers) write the
// same bytes.
void check_nonfinite_block(SlowRecipe r, const std::vector<float>& x, uint64_t key,
                           MismatchTally& t) {
  uint8_t out[2][33];
  std::memset(out[0], 0x00, sizeof out[0]);
  std::memset(out[1], 0xA5, sizeof out[1]);
  bool ok[2];
  for (int c = 0; c < 2; ++c) ok[c] = test::block_fn(r)(x.data(), &out[c][32], out[c]);
  t.check(key, 0, ok[0], "non-finite block must return false");
  t.check(key, 0, ok[1], "non-finite block must return false");
  const int n = test::slow_block_size(r);
  for (int i = 0; i < n; ++i) t.check(key, out[0][i], out[1][i], "non-deterministic code");
  t.check(key, out[0][32], out[1][32], "non-deterministic scale");
}

void sweep_recipe(SlowRecipe r) {
  const int n = test::slow_block_size(r);
  constexpr uint64_t kAnchorsN = sizeof kAnchors / sizeof kAnchors[0];
  std::atomic<uint64_t> nonzero{0};
  const MismatchTally t = test::parallel_sweep(
      0, kAnchorsN << 16, [&](uint64_t lo, uint64_t hi, MismatchTally& tally) {
        uint64_t nz = 0;
        for (uint64_t key = lo; key < hi; ++key) {
          const uint16_t v = static_cast<uint16_t>(key & 0xFFFFu);
          const std::vector<float> x = make_block(kAnchors[key >> 16].bits, v, n);
          if (test::bf16_is_finite(v)) {
            check_block(r, x, key, tally, nz);
          } else {
            check_nonfinite_block(r, x, key, tally);
          }
        }
        nonzero += nz;
      });
  const uint64_t nonzero_total = nonzero.load();
  const std::string what = std::string(test::slow_recipe_name(r)) +
                           " blocks (key = anchor index << 16 | bf16 pattern)";
  EXPECT_EQ(t.mismatches, 0u) << t.describe(what);
  EXPECT_GT(t.checked, kAnchorsN << 16);
  EXPECT_GT(nonzero_total, (kAnchorsN << 16) * n / 4) << "QDQ outputs are mostly zero";
  std::printf("[dsv41] %s; %llu non-zero QDQ values\n", t.describe(what).c_str(),
              static_cast<unsigned long long>(nonzero_total));
}

TEST(QdqExhaustive, CompressedKvBlockAllBf16) { sweep_recipe(SlowRecipe::kCompressedKv); }
TEST(QdqExhaustive, IndexBlockAllBf16) { sweep_recipe(SlowRecipe::kIndex); }
TEST(QdqExhaustive, Fp8BlockAllBf16) { sweep_recipe(SlowRecipe::kFp8); }

// The anchors are what their comments say (a typo in a hex literal would silently change the
// covered path).
TEST(QdqExhaustive, AnchorsAreTheNamedValues) {
  EXPECT_EQ(test::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(test::bf16_to_float(0x40C0), 6.0f);
  EXPECT_EQ(test::bf16_to_float(0x4134), 11.25f);
  EXPECT_EQ(test::bf16_to_float(0x4040), 3.0f);
  EXPECT_EQ(test::bf16_to_float(0x43E0), 448.0f);
  EXPECT_EQ(test::bf16_to_float(0x4528), 2688.0f);
  EXPECT_LT(test::bf16_to_float(0x38D1), 1e-4f);
  EXPECT_GT(test::bf16_to_float(0x38D2), 1e-4f);
  EXPECT_EQ(test::bf16_to_float(0x3C40), std::ldexp(6.0f, -9));
  EXPECT_EQ(test::bf16_to_float(0x3C90), std::ldexp(9.0f, -9));
  EXPECT_EQ(test::bf16_to_float(0x01C0), std::ldexp(6.0f, -126));
  EXPECT_EQ(test::bf16_to_float(0x7F7F), std::ldexp(255.0f, 120));
}

}  // namespace
}  // namespace dsv41::formats
