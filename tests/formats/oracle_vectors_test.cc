// The block recipes and packed entries of formats/ against the OFFICIAL DeepSeek-V4.1-Flash code's
// outputs for the 10 adversarial quant input sets (golden/vectors/kernels_quant.h5, copied from
// shared/oracle/kernels.h5 by scripts/extract_golden.py; provenance in golden/README.md).
//
// For every set, row and block whose inputs are all finite: scale byte, element codes, packed
// bytes (FP4: two codes per byte, element 2k in the low nibble) and bf16 QDQ bits must be equal
// BIT FOR BIT, through the raw entry functions and through the checked qdq_rows. A block holding
// NaN/Inf is skipped: the official output there is port-specific garbage and dsv41's documented
// policy is an error, so the raw block function must return false for exactly those blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "golden/golden_io.h"
#include "tests/support/recipe_under_test.h"
#include "tests/support/slow_minifloat.h"
#include "tests/support/sweep.h"

namespace dsv41::formats {
namespace {

using golden::Array;
using golden::H5File;
using test::SlowRecipe;

const std::string kGolden = std::string(DSV41_SOURCE_DIR) + "/golden/vectors/kernels_quant.h5";

// The 10 input sets (oracle README §4); each covers one adversarial path.
const char* const kSets[] = {
    "allbits_perm",                 // all 65536 bf16 patterns, random order: mixed-magnitude blocks
    "allbits_seq",                  // all 65536 patterns in bit order: one binade per block
    "allfinite_anchor_1p0",         // every finite pattern beside amax 1 (inexact main KV scale)
    "allfinite_anchor_448",         // ... beside amax 448 (fp8 scale 1)
    "allfinite_anchor_below_1e-4",  // ... beside an amax just below the fp8 floor
    "fp4_e4m3_scale_edges",         // amax at 6 x every E4M3 value and midpoint; saturation
    "fp4_ties",                     // E2M1 midpoints and neighbours at scales 2^-12 .. 2^11
    "random",                       // log-normal rows, width 128 (several blocks per row)
    "scale_edges_448",              // +-448 * 2^k and neighbours: the fp8 power-of-two edge
    "specials",                     // +-0, subnormals, bf16 max, +-Inf, NaN, ties, floors
};

struct Recipe {
  const char* prefix;  // dataset prefix in the golden file
  SlowRecipe r;
  bool (*pack)(const float*, int, uint8_t*);
  void (*unpack)(const uint8_t*, int, float*);
};
const Recipe kFp8{"fp8", SlowRecipe::kFp8, pack_window_kv, unpack_window_kv};
const Recipe kFp4E8m0{"fp4_e8m0_b32", SlowRecipe::kIndex, pack_index_keys, unpack_index_keys};
const Recipe kFp4E4m3{"fp4_e4m3_b16", SlowRecipe::kCompressedKv, pack_compressed_kv, unpack_compressed_kv};

struct Counts {
  int64_t compared = 0;    // finite blocks compared
  int64_t skipped = 0;     // blocks the block function reported non-finite
  int64_t nonfinite = 0;   // blocks with a NaN/Inf input, counted from the input bits
  int64_t nonzero = 0;     // compared QDQ values that are not +-0
  int64_t nan_qdq = 0;     // compared QDQ values that are NaN
};

// Compares one set; mismatches go to `tally` (key = row << 16 | element).
Counts compare_set(const H5File& f, const std::string& set, const Recipe& rec,
                   test::MismatchTally& tally) {
  const std::string g = "quant/" + set + "/";
  const std::string p = g + rec.prefix;
  const Array<uint16_t> input = f.read<uint16_t>(g + "input/bits", 2);  // [rows, width] bf16
  const Array<uint8_t> q = f.read<uint8_t>(p + "_q/bits", 2);           // fp8 [rows, width]; fp4 [rows, width/2]
  const Array<uint8_t> scale = f.read<uint8_t>(p + "_scale/bits", 2);   // [rows, width/block]
  const Array<uint16_t> qdq = f.read<uint16_t>(p + "_qdq/bits", 2);     // [rows, width] bf16
  const bool fp4 = rec.r != SlowRecipe::kFp8;
  const Array<uint8_t> codes = fp4 ? f.read<uint8_t>(p + "_q/codes", 2) : q;  // [rows, width]
  const int64_t rows = input.dim(0);
  const int width = static_cast<int>(input.dim(1));
  const int n = test::slow_block_size(rec.r);
  const int value_bytes = fp4 ? width / 2 : width;
  EXPECT_EQ(q.dim(1), value_bytes) << p;
  EXPECT_EQ(scale.dim(1), width / n) << p;
  EXPECT_EQ(qdq.shape, input.shape) << p;
  EXPECT_EQ(codes.shape, input.shape) << p;

  Counts c;
  std::vector<float> x(width), back(width);
  std::vector<uint8_t> entry(entry_bytes(test::cache_format_of(rec.r), width));
  std::vector<float> finite_rows;  // rows whose blocks are all finite, for qdq_rows
  std::vector<int64_t> finite_row_ids;
  for (int64_t r = 0; r < rows; ++r) {
    bool row_finite = true;
    for (int i = 0; i < width; ++i) x[i] = test::bf16_to_float(input.at(r, i));
    rec.pack(x.data(), width, entry.data());
    rec.unpack(entry.data(), width, back.data());
    for (int b = 0; b < width / n; ++b) {
      bool inputs_finite = true;
      for (int i = b * n; i < (b + 1) * n; ++i) inputs_finite &= test::bf16_is_finite(input.at(r, i));
      c.nonfinite += !inputs_finite;
      const test::QuantizedBlock blk = test::quantize_block(rec.r, x.data() + b * n);
      if (!blk.finite) {
        ++c.skipped;
        row_finite = false;
        continue;
      }
      ++c.compared;
      const uint64_t key = static_cast<uint64_t>(r) << 16;
      tally.check(key | b, scale.at(r, b), blk.scale, "scale byte");
      tally.check(key | b, scale.at(r, b), entry[value_bytes + b], "entry scale byte");
      for (int i = b * n; i < (b + 1) * n; ++i) {
        tally.check(key | i, codes.at(r, i), blk.codes[i - b * n], "element code");
        tally.check(key | i, qdq.at(r, i), f32_bits(back[i]) >> 16, "unpacked QDQ bf16");
        tally.check(key | i, 0, f32_bits(back[i]) & 0xFFFFu, "QDQ not a bf16 value");
        tally.check(key | i, qdq.at(r, i), f32_bits(blk.qdq[i - b * n]) >> 16, "block QDQ");
        c.nonzero += (qdq.at(r, i) & 0x7FFFu) != 0;
        c.nan_qdq += std::isnan(back[i]);
      }
      for (int k = b * n * value_bytes / width; k < (b + 1) * n * value_bytes / width; ++k) {
        tally.check(key | k, q.at(r, k), entry[k], fp4 ? "packed nibble byte" : "fp8 byte");
      }
    }
    if (row_finite) {
      finite_rows.insert(finite_rows.end(), x.begin(), x.end());
      finite_row_ids.push_back(r);
    }
  }
  // The checked host API on every all-finite row at once.
  const int nf = static_cast<int>(finite_row_ids.size());
  const std::vector<float> via_api = qdq_rows(test::cache_format_of(rec.r), finite_rows, nf, width);
  for (int k = 0; k < nf; ++k) {
    for (int i = 0; i < width; ++i) {
      tally.check(static_cast<uint64_t>(finite_row_ids[k]) << 16 | i, qdq.at(finite_row_ids[k], i),
                  f32_bits(via_api[static_cast<size_t>(k) * width + i]) >> 16, "qdq_rows");
    }
  }
  return c;
}

void compare_recipe(const Recipe& rec) {
  const H5File f(kGolden);
  Counts total;
  for (const char* set : kSets) {
    test::MismatchTally tally;
    const Counts c = compare_set(f, set, rec, tally);
    const std::string what = std::string(set) + " " + rec.prefix + " (key = row << 16 | index)";
    EXPECT_EQ(tally.mismatches, 0u) << tally.describe(what);
    EXPECT_GT(c.compared, 0) << what;
    EXPECT_EQ(c.skipped, c.nonfinite) << what << ": skipped blocks must be the non-finite ones";
    EXPECT_EQ(c.nan_qdq, 0) << what;
    std::printf("[dsv41] oracle %-28s %-13s compared %6lld blocks, skipped %4lld non-finite\n", set,
                rec.prefix, static_cast<long long>(c.compared), static_cast<long long>(c.skipped));
    total.compared += c.compared;
    total.skipped += c.skipped;
    total.nonzero += c.nonzero;
  }
  std::printf("[dsv41] oracle total %s: compared %lld blocks, skipped %lld\n", rec.prefix,
              static_cast<long long>(total.compared), static_cast<long long>(total.skipped));
  EXPECT_GT(total.nonzero, total.compared) << "compared QDQ outputs are mostly zero";
}

TEST(OracleVectors, Fp8ActQuantMatchesOfficial) { compare_recipe(kFp8); }
TEST(OracleVectors, Fp4E8m0IndexMatchesOfficial) { compare_recipe(kFp4E8m0); }
TEST(OracleVectors, Fp4E4m3CompressedKvMatchesOfficial) { compare_recipe(kFp4E4m3); }

TEST(OracleVectors, FileHoldsTheTenSetsAndTheFp4Table) {
  const H5File f(kGolden);
  std::vector<std::string> want(std::begin(kSets), std::end(kSets));
  want.push_back("FP4_TABLE");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(f.children("quant"), want);
  // The official FP4_TABLE (E2M1 code -> value) equals e2m1_decode for all 16 codes.
  const Array<float> table = f.read<float>("quant/FP4_TABLE/value", 1);
  ASSERT_EQ(table.size(), 16u);
  for (uint32_t code = 0; code < 16; ++code) {
    EXPECT_EQ(f32_bits(table.data[code]), f32_bits(e2m1_decode(code))) << code;
  }
}

}  // namespace
}  // namespace dsv41::formats
