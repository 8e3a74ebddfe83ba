// tests/cuda/kv_quant_ops_test.cc: CudaOps::qdq, write_entries and read_entries (cuda/kv_quant.cu's
// packers behind the seam) vs reference/ops/kv_quant.cc, bit for bit, for every cache format: one row,
// odd row counts, entries written out of order and rewritten, reads of repeated entries, exact
// ties at the quantizer's rounding midpoints (powers of two), zeros; the reference's errors on a
// non-finite row and an entry outside the cache. PackRowsBf16: gpu::pack_rows_bf16 (bf16 storage) and
// gpu::pack_rows (fp32 storage) of the two KV formats vs formats/packed.h, bytes and finite flags:
// random rows of every magnitude, blocks holding Inf / NaN, and for every positive bf16 amax the bf16
// values next to the seven E2M1 rounding midpoints of its FP4 block scale (cuda/kv_pack.cu's bounds),
// below and above 16384 rows (the bf16 FP4 packer's table path), and non-finite blocks (Inf, NaNs
// of several payloads) on the table path.
#include <limits>

#include "cuda/device.h"
#include "formats/cache_format.h"
#include "formats/packed.h"
#include "reference/ops/kv_quant.h"
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

// Host pack of `rows` x `dim` values (formats/packed.h) -> entries and finite flags.
void host_pack(CacheFormat f, const std::vector<float>& x, int64_t rows, int dim, std::vector<uint8_t>& bytes,
               std::vector<uint8_t>& flags) {
  const int eb = formats::entry_bytes(f, dim);
  bytes.assign(static_cast<size_t>(rows * eb), 0);
  flags.assign(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * dim;
    uint8_t* out = bytes.data() + r * eb;
    const bool ok = f == CacheFormat::kWindowKvFp8 ? formats::pack_window_kv(row, dim, out)
                                                   : formats::pack_compressed_kv(row, dim, out);
    flags[static_cast<size_t>(r)] = ok ? 1 : 0;
  }
}

// Packs x (bf16 values) on the device in both storages and compares with the host, bit for bit.
void expect_device_pack_equals_host(CacheFormat f, const std::vector<float>& x, int dim, const std::string& what) {
  const int64_t rows = static_cast<int64_t>(x.size()) / dim;
  const int eb = formats::entry_bytes(f, dim);
  std::vector<uint8_t> want, want_flags;
  host_pack(f, x, rows, dim, want, want_flags);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bits(x[i]) & 0xFFFFu, 0u) << "input " << i << " is not a bf16 value";
    xb[i] = static_cast<uint16_t>(bits(x[i]) >> 16);
  }
  gpu::DeviceBuffer<float> dx(x.size());
  gpu::DeviceBuffer<uint16_t> dxb(x.size());
  dx.upload(x);
  dxb.upload(xb);
  for (bool bf16 : {false, true}) {
    gpu::DeviceBuffer<uint8_t> out(static_cast<size_t>(rows * eb) + 1), flags(static_cast<size_t>(rows) + 1);
    out.poison();
    flags.poison();
    if (bf16) gpu::pack_rows_bf16(f, dxb.get(), rows, dim, out.get(), flags.get());
    else gpu::pack_rows(f, dx.get(), rows, dim, out.get(), flags.get());
    std::vector<uint8_t> got = out.download(), got_flags = flags.download();
    ASSERT_EQ(got.back(), 0xA5) << "wrote past the entries";
    got.pop_back();
    got_flags.pop_back();
    size_t bad = 0;
    while (bad < got.size() && got[bad] == want[bad]) ++bad;
    EXPECT_EQ(bad, got.size()) << formats::info(f).name << " " << what << (bf16 ? " bf16" : " fp32")
                               << " storage: first byte difference at " << bad << " (row " << bad / eb << ")";
    EXPECT_EQ(got_flags, want_flags) << formats::info(f).name << " " << what << (bf16 ? " bf16" : " fp32");
  }
}

TEST(KvQuantOps, PackRowsBf16AndFp32EqualHostPack) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (CacheFormat f : {CacheFormat::kWindowKvFp8, CacheFormat::kCompressedKvFp4}) {
    for (int dim : {64, 96, 512}) {
      if (f == CacheFormat::kWindowKvFp8 && dim % 32 != 0) continue;
      // Random rows: magnitudes from bf16 subnormals to near the bf16 maximum, ties, zeros.
      std::vector<float> x;
      for (float scale : {1e-39f, 1e-20f, 0.01f, 1.0f, 300.0f, 1e30f, 1e38f}) {
        const reference::Tensor<float> r = random_bf16({37, dim}, scale);
        x.insert(x.end(), r.data().begin(), r.data().end());
      }
      const reference::Tensor<float> t = tie_rows(33, dim);
      x.insert(x.end(), t.data().begin(), t.data().end());
      for (int i = 0; i < dim; ++i) x.push_back(i % 2 ? -0.0f : 0.0f);  // zero row
      for (int i = 0; i < dim; ++i) x.push_back(formats::bf16_decode(i % 2 ? 0xFF7Fu : 0x7F7Fu));  // +-max
      expect_device_pack_equals_host(f, x, dim, "random rows");
      // Non-finite blocks: Inf, -Inf, NaN at various places (the other blocks stay exact).
      std::vector<float> y = random_bf16({6, dim}, 2.0f).data();
      y[3] = std::numeric_limits<float>::infinity();
      y[static_cast<size_t>(dim + dim - 1)] = -std::numeric_limits<float>::infinity();
      y[static_cast<size_t>(2 * dim + 17)] = std::numeric_limits<float>::quiet_NaN();
      y[static_cast<size_t>(3 * dim + 40)] = -std::numeric_limits<float>::quiet_NaN();
      y[static_cast<size_t>(4 * dim)] = std::numeric_limits<float>::quiet_NaN();
      y[static_cast<size_t>(4 * dim + 1)] = std::numeric_limits<float>::infinity();
      expect_device_pack_equals_host(f, y, dim, "non-finite blocks");
    }
  }
  // Every positive bf16 amax (and 0): a block of 16 = [amax, values next to t * s], s the block's
  // FP4 scale and t the seven E2M1 midpoints; the bf16 values just below, at and above t * s.
  std::vector<float> x;
  for (uint32_t a = 0; a <= 0x7F7Fu; ++a) {
    const float amax = formats::bf16_decode(a);
    const float s = formats::e4m3_decode(formats::compressed_kv_scale(amax));
    std::vector<float> near;
    for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
      const uint32_t lo = bits(t * s) >> 16;  // bf16 truncation of t * s (<= t * s)
      for (uint32_t b : {lo - 1, lo, lo + 1}) near.push_back(formats::bf16_decode(b));
    }
    // Two blocks per amax: amax then 15 of the 21 values; -amax then the rest, negated, and zeros.
    x.push_back(amax);
    for (size_t i = 0; i < 15; ++i) x.push_back(near[i] <= amax ? near[i] : 0.0f);
    x.push_back(-amax);
    for (size_t i = 15; i < 21; ++i) x.push_back(near[i] <= amax ? -near[i] : -0.0f);
    for (int i = 0; i < 9; ++i) x.push_back(i % 2 ? 0.0f : -0.0f);
  }
  while (x.size() % 512 != 0) x.push_back(0.0f);
  expect_device_pack_equals_host(CacheFormat::kCompressedKvFp4, x, 512, "E2M1 midpoints of every bf16 amax");
  expect_device_pack_equals_host(CacheFormat::kWindowKvFp8, x, 512, "E2M1 midpoints of every bf16 amax");
  // Again from 16384 rows on, where the bf16 FP4 packer reads its scale and bounds from its tables.
  const std::vector<float> once = x;
  while (x.size() < size_t{16384} * 512) x.insert(x.end(), once.begin(), once.end());
  expect_device_pack_equals_host(CacheFormat::kCompressedKvFp4, x, 512, "E2M1 midpoints, table path");
  // Non-finite blocks on the table path (the scale table's Inf / NaN entries) and next to finite
  // blocks of the same warp (the packers' per-warp finite vote): Inf, -Inf and NaNs of several
  // payloads and signs, alone or together in a block, in rows spread over the input.
  const uint32_t specials[] = {0x7F80u, 0xFF80u, 0x7FC0u, 0xFFC0u, 0x7F81u, 0x7FFFu, 0xFFA5u};
  size_t n_special = 0;
  for (size_t row = 3; row < size_t{16384}; row += 997) {
    for (size_t k = 0; k < 7; ++k) {
      const size_t at = row * 512 + (row + 61 * k) % 512;  // blocks of various positions in the row
      x[at] = formats::bf16_decode(specials[(row + k) % 7]);
      if (k % 3 == 0) x[at ^ 1] = formats::bf16_decode(specials[(row + k + 3) % 7]);  // two in a block
      ++n_special;
    }
  }
  ASSERT_GT(n_special, 100u);
  expect_device_pack_equals_host(CacheFormat::kCompressedKvFp4, x, 512, "non-finite blocks, table path");
  expect_device_pack_equals_host(CacheFormat::kWindowKvFp8, x, 512, "non-finite blocks, 16384 rows");
}

}  // namespace
}  // namespace dsv41::test
