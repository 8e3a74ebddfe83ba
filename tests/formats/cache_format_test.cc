// The checked host API of formats/cache_format.h: names and byte accounting, the packed layout
// (nibble order, scales after the values), pack_rows/unpack_rows/qdq_rows against the block
// functions, and the errors: non-finite input named by row and element, corrupt entries, wrong
// sizes and dims.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "base/error.h"
#include "formats/packed.h"
#include "tests/support/error_of.h"
#include "tests/support/recipe_under_test.h"
#include "tests/support/seed.h"
#include "tests/support/slow_recipes.h"

namespace dsv41::formats {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::SlowRecipe;

// [rows, dim] random bf16 values: per row a log-uniform magnitude over 2^-20 .. 2^20, per element
// a spread of up to 2^-12 below it, random signs; a few exact zeros.
std::vector<float> random_bf16_rows(const std::string& name, int rows, int dim) {
  std::mt19937_64 rng(test::seed_for(name + "/rows=" + std::to_string(rows) + ",dim=" +
                                     std::to_string(dim)));
  std::vector<float> x(static_cast<size_t>(rows) * dim);
  for (int r = 0; r < rows; ++r) {
    const int top = static_cast<int>(rng() % 41) - 20 + 127;  // bf16 exponent field of the row
    for (int i = 0; i < dim; ++i) {
      const uint64_t u = rng();
      const uint32_t field = static_cast<uint32_t>(top - static_cast<int>(u % 13));
      const uint32_t bits = ((u >> 8) & 1u) << 15 | field << 7 | ((u >> 16) & 0x7Fu);
      x[static_cast<size_t>(r) * dim + i] = (u >> 40) % 29 == 0 ? 0.0f : test::bf16_to_float(bits);
    }
  }
  return x;
}

TEST(CacheFormat, NamesAndInfo) {
  const CacheFormat all[] = {CacheFormat::kCompressedKvFp4, CacheFormat::kIndexKeysFp4,
                             CacheFormat::kWindowKvFp8, CacheFormat::kBf16};
  const int blocks[] = {16, 32, 32, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(cache_format_from_name(info(all[i]).name), all[i]);
    EXPECT_EQ(info(all[i]).block, blocks[i]);
  }
  EXPECT_STREQ(info(CacheFormat::kCompressedKvFp4).scale, "E4M3");
  EXPECT_STREQ(info(CacheFormat::kIndexKeysFp4).scale, "E8M0");
  const std::string msg = error_of([] { cache_format_from_name("fp4"); });
  EXPECT_THAT(msg, HasSubstr("unknown cache format 'fp4'"));
  EXPECT_THAT(msg, HasSubstr("fp4_e2m1_e4m3_b16"));
}

// Released dims (512 main / 128 indexer): the 890 B/token budget of numerics.md §0.
TEST(CacheFormat, EntryBytes) {
  EXPECT_EQ(entry_bytes(CacheFormat::kCompressedKvFp4, 512), 288);
  EXPECT_EQ(entry_bytes(CacheFormat::kIndexKeysFp4, 128), 68);
  EXPECT_EQ(entry_bytes(CacheFormat::kWindowKvFp8, 512), 528);
  EXPECT_EQ(entry_bytes(CacheFormat::kBf16, 512), 1024);
  EXPECT_EQ(entry_bytes(CacheFormat::kCompressedKvFp4, 128), 72);  // tiny config
  for (const int dim : {0, -16, 24, 8}) {
    EXPECT_THAT(error_of([&] { entry_bytes(CacheFormat::kCompressedKvFp4, dim); }),
                HasSubstr("dim=" + std::to_string(dim)));
  }
  EXPECT_THAT(error_of([] { entry_bytes(CacheFormat::kIndexKeysFp4, 48); }), HasSubstr("32"));
  EXPECT_THAT(error_of([] { entry_bytes(CacheFormat::kWindowKvFp8, 16); }), HasSubstr("dim=16"));
}

// pack_rows bytes = [dim/2 nibble bytes, element 2k in the low nibble][dim/block scales] per row,
// built here from the block functions' codes; unpack_rows = per-element dequant. Shapes: 17 rows
// (odd) of the released dims (512 / 128 / 512) and of the tiny config's (128 / 64 / 128).
TEST(CacheFormat, PackRowsLayoutMatchesBlockFunctions) {
  struct Shape {
    SlowRecipe r;
    int dim;
  };
  const Shape shapes[] = {{SlowRecipe::kCompressedKv, 512}, {SlowRecipe::kIndex, 128},
                          {SlowRecipe::kFp8, 512},    {SlowRecipe::kCompressedKv, 128},
                          {SlowRecipe::kIndex, 64},   {SlowRecipe::kFp8, 128}};
  constexpr int kRows = 17;
  for (const Shape& s : shapes) {
    const CacheFormat f = test::cache_format_of(s.r);
    const int n = test::slow_block_size(s.r);
    const bool fp4 = s.r != SlowRecipe::kFp8;
    const int value_bytes = fp4 ? s.dim / 2 : s.dim;
    const int eb = entry_bytes(f, s.dim);
    ASSERT_EQ(eb, value_bytes + s.dim / n);
    const std::vector<float> x = random_bf16_rows(info(f).name, kRows, s.dim);
    const std::vector<uint8_t> bytes = pack_rows(f, x, kRows, s.dim);
    const std::vector<float> back = unpack_rows(f, bytes, kRows, s.dim);
    ASSERT_EQ(bytes.size(), static_cast<size_t>(kRows) * eb);
    int nonzero = 0;
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* entry = bytes.data() + static_cast<size_t>(r) * eb;
      for (int b = 0; b < s.dim / n; ++b) {
        const size_t at = static_cast<size_t>(r) * s.dim + static_cast<size_t>(b) * n;
        const test::QuantizedBlock q = test::quantize_block(s.r, x.data() + at);
        ASSERT_EQ(entry[value_bytes + b], q.scale) << info(f).name << " row " << r << " block " << b;
        for (int i = 0; i < n; ++i) {
          const int e = b * n + i;
          const uint8_t stored = fp4 ? (entry[e / 2] >> (e % 2 ? 4 : 0)) & 0xFu : entry[e];
          ASSERT_EQ(stored, q.codes[i]) << info(f).name << " row " << r << " element " << e;
          ASSERT_EQ(f32_bits(back[at + i]), f32_bits(q.qdq[i])) << info(f).name << " element " << e;
          nonzero += back[at + i] != 0.0f;
        }
      }
    }
    EXPECT_GT(nonzero, kRows * s.dim / 4) << info(f).name;
    EXPECT_EQ(qdq_rows(f, x, kRows, s.dim), back);
  }
}

// The fixed-size entry structs have the same layout as pack_compressed_kv etc.
TEST(CacheFormat, EntryStructsMatchPackedBytes) {
  const std::vector<float> x = random_bf16_rows("entry_structs", 1, 512);
  CompressedKvEntry<512> main{};
  WindowKvEntry<512> swa{};
  IndexKeysEntry<128> index{};
  EXPECT_TRUE(pack_compressed_kv(x.data(), 512, reinterpret_cast<uint8_t*>(&main)));
  EXPECT_TRUE(pack_window_kv(x.data(), 512, reinterpret_cast<uint8_t*>(&swa)));
  EXPECT_TRUE(pack_index_keys(x.data(), 128, reinterpret_cast<uint8_t*>(&index)));
  const auto rows = [&](CacheFormat f, int dim) {
    return pack_rows(f, std::vector<float>(x.begin(), x.begin() + dim), 1, dim);
  };
  EXPECT_EQ(std::memcmp(&main, rows(CacheFormat::kCompressedKvFp4, 512).data(), sizeof main), 0);
  EXPECT_EQ(std::memcmp(&swa, rows(CacheFormat::kWindowKvFp8, 512).data(), sizeof swa), 0);
  EXPECT_EQ(std::memcmp(&index, rows(CacheFormat::kIndexKeysFp4, 128).data(), sizeof index), 0);
  // CUDA's __nv_cvt_float2_to_fp4x2({1, -3}) = 0xD2 (numerics.md §6).
  const uint8_t codes[2] = {e2m1_encode(1.0f), e2m1_encode(-3.0f)};
  uint8_t byte = 0;
  pack_nibbles(codes, 2, &byte);
  EXPECT_EQ(byte, 0xD2);
}

TEST(CacheFormat, Bf16RowsRoundTrip) {
  const std::vector<float> x = random_bf16_rows("bf16", 5, 33);  // odd dim: bf16 has no block
  EXPECT_EQ(qdq_rows(CacheFormat::kBf16, x, 5, 33), x);
}

// A NaN or +-Inf anywhere: pack_rows throws naming the row, element and block.
TEST(CacheFormat, PackRowsRejectsNonFiniteNamingRowAndElement) {
  const float specials[] = {NAN, -NAN, HUGE_VALF, -HUGE_VALF};
  for (const SlowRecipe r : test::kAllSlowRecipes) {
    const CacheFormat f = test::cache_format_of(r);
    for (const float bad : specials) {
      std::vector<float> x = random_bf16_rows("nonfinite", 3, 64);
      x[2 * 64 + 37] = bad;
      const std::string msg = error_of([&] { pack_rows(f, x, 3, 64); });
      EXPECT_THAT(msg, HasSubstr("row 2"));
      EXPECT_THAT(msg, HasSubstr("element 37"));
      EXPECT_THAT(msg, HasSubstr("block " + std::to_string(37 / test::slow_block_size(r))));
      EXPECT_THAT(msg, HasSubstr(info(f).name));
    }
  }
  std::vector<float> x(8, 1.0f);
  x[6] = NAN;
  EXPECT_THAT(error_of([&] { pack_rows(CacheFormat::kBf16, x, 2, 4); }),
              HasSubstr("at row 1, element 2"));
}

// Every output of pack_rows must be accepted by unpack_rows. A finite fp32 input beyond the bf16
// range (3.4e38 > bf16 max + half an ulp) rounds to bf16 Inf: pack_bf16 reports it (returns
// false), but pack_rows only looks for non-finite *inputs*, finds none, and returns an entry that
// unpack_rows then calls corrupt.
TEST(CacheFormat, PackRowsOutputIsAcceptedByUnpackRows) {
  const std::vector<float> x = {1.0f, 3.4e38f, -2.0f, 0.5f};
  std::vector<uint8_t> bytes;
  std::string pack_error;
  try {
    bytes = pack_rows(CacheFormat::kBf16, x, 1, 4);
  } catch (const Error& e) {
    pack_error = e.what();
  }
  if (pack_error.empty()) {
    EXPECT_NO_THROW(unpack_rows(CacheFormat::kBf16, bytes, 1, 4))
        << "pack_rows(kBf16, {1, 3.4e38, -2, 0.5}) returned bytes that unpack_rows rejects";
  } else {
    EXPECT_THAT(pack_error, HasSubstr("element 1"));
  }
}

// Corrupt entries: positions and bytes are named.
TEST(CacheFormat, UnpackRowsRejectsCorruptEntries) {
  const auto corrupt = [](CacheFormat f, int dim, int row, int byte, uint8_t value) {
    const std::vector<float> x = random_bf16_rows("corrupt", 3, dim);
    std::vector<uint8_t> bytes = pack_rows(f, x, 3, dim);
    bytes[static_cast<size_t>(row) * entry_bytes(f, dim) + byte] = value;
    return error_of([&] { unpack_rows(f, bytes, 3, dim); });
  };
  // Main KV (dim 64: 32 nibble bytes, scales at 32..35): zero, NaN and negative E4M3 scales.
  for (const uint8_t s : {0x00, 0x7F, 0x80, 0x81, 0xFE, 0xFF}) {
    const std::string msg = corrupt(CacheFormat::kCompressedKvFp4, 64, 1, 32 + 3, s);
    EXPECT_THAT(msg, HasSubstr("row 1"));
    EXPECT_THAT(msg, HasSubstr("block 3"));
    EXPECT_THAT(msg, HasSubstr("scale"));
  }
  // Index (dim 64: scales at 32, 33) and SWA (dim 64: scales at 64, 65): E8M0 NaN scale.
  EXPECT_THAT(corrupt(CacheFormat::kIndexKeysFp4, 64, 2, 33, 0xFF), HasSubstr("row 2"));
  EXPECT_THAT(corrupt(CacheFormat::kIndexKeysFp4, 64, 2, 33, 0xFF), HasSubstr("block 1 is 0xFF"));
  EXPECT_THAT(corrupt(CacheFormat::kWindowKvFp8, 64, 0, 65, 0xFF), HasSubstr("block 1 is 0xFF"));
  // SWA E4M3 NaN elements (both signs).
  for (const uint8_t v : {0x7F, 0xFF}) {
    const std::string msg = corrupt(CacheFormat::kWindowKvFp8, 64, 2, 5, v);
    EXPECT_THAT(msg, HasSubstr("row 2"));
    EXPECT_THAT(msg, HasSubstr("element 5"));
    EXPECT_THAT(msg, HasSubstr("NaN"));
  }
  // bf16 Inf element (high byte 0x7F, low byte 0x80 of element 3 -> bytes 6, 7).
  std::vector<uint8_t> bf = pack_rows(CacheFormat::kBf16, std::vector<float>(8, 1.0f), 2, 4);
  bf[4 * 2 + 6] = 0x80;
  bf[4 * 2 + 7] = 0x7F;
  EXPECT_THAT(error_of([&] { unpack_rows(CacheFormat::kBf16, bf, 2, 4); }),
              HasSubstr("row 1: element 3"));
}

TEST(CacheFormat, RejectsWrongSizesAndDims) {
  const std::vector<float> x(2 * 64, 1.0f);
  EXPECT_THAT(error_of([&] { pack_rows(CacheFormat::kCompressedKvFp4, x, 3, 64); }),
              HasSubstr("expected rows*dim = 3*64"));
  EXPECT_THAT(error_of([&] { pack_rows(CacheFormat::kCompressedKvFp4, x, 2, 40); }), HasSubstr("dim=40"));
  EXPECT_THAT(error_of([&] { pack_rows(CacheFormat::kWindowKvFp8, x, -2, -64); }),
              HasSubstr("dim=-64"));
  const std::vector<uint8_t> bytes = pack_rows(CacheFormat::kIndexKeysFp4, x, 2, 64);
  EXPECT_THAT(error_of([&] { unpack_rows(CacheFormat::kIndexKeysFp4, bytes, 3, 64); }),
              HasSubstr("expected rows*entry_bytes = 3*34"));
  EXPECT_THAT(error_of([&] { unpack_rows(CacheFormat::kIndexKeysFp4, bytes, 2, 48); }),
              HasSubstr("dim=48"));
  EXPECT_THAT(error_of([&] { unpack_rows(CacheFormat::kIndexKeysFp4, bytes, -1, 64); }),
              HasSubstr("unpack_rows"));
  EXPECT_TRUE(pack_rows(CacheFormat::kCompressedKvFp4, {}, 0, 64).empty());  // zero rows is fine
}


// check_entries: every byte pack_rows produces is valid; each kind of invalid byte is counted and
// the first named, for every format (a negative E4M3 scale: the bit flip 0x29 -> 0xA9).
TEST(CacheFormatCheckEntries, ValidPackedRowsAndEachInvalidByteKind) {
  const int rows = 4, dim = 64;
  const std::vector<float> x = random_bf16_rows("check_entries", rows, dim);
  for (CacheFormat f : {CacheFormat::kCompressedKvFp4, CacheFormat::kIndexKeysFp4, CacheFormat::kWindowKvFp8,
                        CacheFormat::kBf16}) {
    const std::vector<uint8_t> bytes = pack_rows(f, x, rows, dim);
    ASSERT_FALSE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; })) << info(f).name;
    const EntryCheck ok = check_entries(f, bytes, rows, dim);
    EXPECT_EQ(ok.rows, rows);
    EXPECT_EQ(ok.invalid, 0) << info(f).name << ": " << ok.why;
    EXPECT_EQ(ok.first, -1);
  }
  const int eb = entry_bytes(CacheFormat::kCompressedKvFp4, dim);
  std::vector<uint8_t> kv = pack_rows(CacheFormat::kCompressedKvFp4, x, rows, dim);
  const size_t scale = static_cast<size_t>(2 * eb + dim / 2 + 1);  // row 2, block 1's E4M3 scale
  kv[scale] = static_cast<uint8_t>(kv[scale] | 0x80);               // negative
  kv[static_cast<size_t>(3 * eb + dim / 2)] = 0x7F;                 // row 3: E4M3 NaN
  EntryCheck c = check_entries(CacheFormat::kCompressedKvFp4, kv, rows, dim);
  EXPECT_EQ(c.invalid, 2);
  EXPECT_EQ(c.first, 2);
  EXPECT_THAT(c.why, HasSubstr("row 2"));
  EXPECT_THAT(c.why, HasSubstr("not a positive finite scale"));

  std::vector<uint8_t> keys = pack_rows(CacheFormat::kIndexKeysFp4, x, rows, dim);
  keys[static_cast<size_t>(entry_bytes(CacheFormat::kIndexKeysFp4, dim) + dim / 2)] = 0xFF;  // row 1: E8M0 NaN
  c = check_entries(CacheFormat::kIndexKeysFp4, keys, rows, dim);
  EXPECT_EQ(c.invalid, 1);
  EXPECT_EQ(c.first, 1);
  EXPECT_THAT(c.why, HasSubstr("0xFF (NaN)"));

  std::vector<uint8_t> win = pack_rows(CacheFormat::kWindowKvFp8, x, rows, dim);
  win[5] = 0xFF;  // row 0, element 5: the E4M3 NaN code
  c = check_entries(CacheFormat::kWindowKvFp8, win, rows, dim);
  EXPECT_EQ(c.invalid, 1);
  EXPECT_EQ(c.first, 0);
  EXPECT_THAT(c.why, HasSubstr("NaN code"));

  std::vector<uint8_t> b16 = pack_rows(CacheFormat::kBf16, x, rows, dim);
  b16[static_cast<size_t>(3 * 2 * dim + 1)] = 0x7F;  // row 3, element 0: exponent all ones
  b16[static_cast<size_t>(3 * 2 * dim)] = 0x80;
  c = check_entries(CacheFormat::kBf16, b16, rows, dim);
  EXPECT_EQ(c.invalid, 1);
  EXPECT_EQ(c.first, 3);

  EXPECT_THAT(error_of([&] { check_entries(CacheFormat::kBf16, b16, rows + 1, dim); }), HasSubstr("check_entries"));
}

}  // namespace
}  // namespace dsv41::formats
