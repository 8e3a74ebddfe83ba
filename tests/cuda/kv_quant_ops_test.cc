// tests/cuda/kv_quant_ops_test.cc: CudaOps::qdq, write_entries and read_entries (cuda/kv_quant.cu's
// packers behind the seam) vs reference/kv_quant.cc, bit for bit, for every cache format: one row,
// odd row counts, entries written out of order and rewritten, reads of repeated entries, exact
// ties at the quantizer's rounding midpoints (powers of two), zeros; the reference's errors on a
// non-finite row and an entry outside the cache.
#include <limits>

#include "formats/cache_format.h"
#include "formats/packed.h"
#include "reference/kv_quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using formats::CacheFormat;

struct FormatDim {
  CacheFormat f;
  int64_t dim;
};
const FormatDim kCases[] = {{CacheFormat::kWindowKvFp8, 64},  {CacheFormat::kWindowKvFp8, 512},
                            {CacheFormat::kCompressedKvFp4, 64}, {CacheFormat::kCompressedKvFp4, 512},
                            {CacheFormat::kIndexKeysFp4, 64},   {CacheFormat::kIndexKeysFp4, 128},
                            {CacheFormat::kBf16, 64}};

// Rows with ties: every value a power of two or a midpoint between codes, plus zeros.
reference::Tensor<float> tie_rows(int64_t n, int64_t d) {
  reference::Tensor<float> x({n, d}, "ties");
  std::uniform_int_distribution<int> e(-6, 6), k(0, 7);
  for (float& v : x.data()) v = std::ldexp(1.0f + 0.125f * static_cast<float>(k(rng())), e(rng()));
  if (n > 0) x.at(0, 0) = 0.0f;  // and a zero (rows n = 0 have none)
  return x;
}

TEST(KvQuantOps, QdqEqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const FormatDim c : kCases) {
    for (int64_t n : {0, 1, 7, 33}) {
      for (const reference::Tensor<float>& x : {random_bf16({n, c.dim}, 3.0f), tie_rows(n, c.dim)}) {
        EXPECT_TRUE(same_bits(reference::qdq(c.f, x), cuda_ops().qdq(c.f, x)))
            << formats::info(c.f).name << " dim " << c.dim << " rows " << n;
      }
    }
  }
}

TEST(KvQuantOps, WriteAndReadEntriesEqualReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const FormatDim c : kCases) {
    const int64_t eb = formats::entry_bytes(c.f, static_cast<int>(c.dim)), cap = 11;
    reference::Tensor<uint8_t> want({cap, eb}, "cache");
    reference::Tensor<uint8_t> got = cuda_ops().upload(want);
    for (const std::vector<int64_t>& entries :
         {std::vector<int64_t>{0}, {5, 2, 9}, {10, 0, 1, 2, 3, 4, 5, 6, 7, 8}, {2}, {}}) {
      const reference::Tensor<float> rows = random_bf16({static_cast<int64_t>(entries.size()), c.dim}, 0.5f);
      reference::write_entries(want, c.f, entries, rows);
      cuda_ops().write_entries(got, c.f, entries, rows);
      ASSERT_TRUE(same_bits(want, got)) << formats::info(c.f).name << " dim " << c.dim;
    }
    const reference::CacheRows wc{c.f, c.dim, cap, &want}, gc{c.f, c.dim, cap, &got};
    for (const std::vector<int64_t>& entries : {std::vector<int64_t>{}, {3}, {10, 0, 0, 4}}) {
      EXPECT_TRUE(same_bits(reference::read_entries(wc, entries), cuda_ops().read_entries(gc, entries)));
    }
    EXPECT_THROW(cuda_ops().read_entries(reference::CacheRows{c.f, c.dim, 4, &got}, {4}), Error);
    if (c.f != CacheFormat::kBf16) {
      reference::Tensor<float> bad = random_bf16({2, c.dim});
      bad.at(1, 3) = std::numeric_limits<float>::infinity();
      EXPECT_THROW(cuda_ops().write_entries(got, c.f, {0, 1}, bad), Error);
      EXPECT_THROW(cuda_ops().qdq(c.f, bad), Error);
    }
  }
}

}  // namespace
}  // namespace dsv41::test
