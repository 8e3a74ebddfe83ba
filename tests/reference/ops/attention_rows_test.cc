// tests/reference/ops/attention_rows_test.cc: reference/ops/attention_rows.h.
//   1. compact_attention_rows keeps window indices and -1, maps every compressed index to the row of
//      its entry among the entries read (ascending, each once, exactly those named).
//   2. The reference's sparse_attn on [window | the entries read] with the renumbered indices gives
//      the bits it gives on [window | every entry] with the original ones (what lets CudaOps read a
//      decode step's O(index_topk) entries instead of the whole cache): random cases, repeated and
//      -1 indices, a row of -1 only, a cache no index names.
// Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/cache_format.h"
#include "formats/qdq.h"
#include "reference/ops/attention.h"
#include "reference/ops/attention_rows.h"
#include "reference/ops/kv_quant.h"
#include "reference/seam/ops.h"
#include "tests/support/seed.h"

namespace dsv41::test {
namespace {

using formats::CacheFormat;
using reference::CacheRows;
using reference::Tensor;

Tensor<float> bf16_rows(std::vector<int64_t> shape, std::mt19937_64& rng, const char* name) {
  Tensor<float> t(std::move(shape), name);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : t.data()) v = formats::round_to_bf16(d(rng));
  return t;
}

TEST(CompactAttentionRows, RenumbersToTheEntriesNamedAscending) {
  const uint64_t seed = seed_for("CompactAttentionRows");
  std::printf("seed %llu (DSV41_SEED)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t W = std::uniform_int_distribution<int64_t>(0, 20)(rng);
    const int64_t count = std::uniform_int_distribution<int64_t>(0, 300)(rng);
    std::vector<int32_t> idx(static_cast<size_t>(std::uniform_int_distribution<int>(0, 200)(rng)));
    std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(W + count - 1));
    for (int32_t& r : idx) r = pick(rng);
    const std::vector<int32_t> before = idx;
    const std::vector<int64_t> used = reference::compact_attention_rows(idx, W, count);
    std::vector<int64_t> named;
    for (int32_t r : before) {
      if (r >= W) named.push_back(r - W);
    }
    std::sort(named.begin(), named.end());
    named.erase(std::unique(named.begin(), named.end()), named.end());
    EXPECT_EQ(used, named) << "trial " << trial;
    for (size_t i = 0; i < idx.size(); ++i) {
      if (before[i] < W) {
        EXPECT_EQ(idx[i], before[i]);
      } else {
        ASSERT_GE(idx[i], W);
        ASSERT_LT(idx[i] - W, static_cast<int64_t>(used.size()));
        EXPECT_EQ(used[static_cast<size_t>(idx[i] - W)], before[i] - W) << "trial " << trial << " index " << i;
      }
    }
  }
}

TEST(CompactAttentionRows, TheReferencesAttentionOnTheEntriesReadIsBitForBitTheSame) {
  const uint64_t seed = seed_for("CompactAttentionRowsSparseAttn");
  std::printf("seed %llu (DSV41_SEED)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const reference::seam::Ops& ops = reference::seam::reference_ops();
  const CacheFormat fmt = CacheFormat::kCompressedKvFp4;
  const int64_t T = 5, H = 4, D = 64, W = 7, count = 180, K = W + 24;
  const int64_t eb = formats::entry_bytes(fmt, static_cast<int>(D));
  for (int trial = 0; trial < 4; ++trial) {
    const Tensor<float> q = bf16_rows({T, H, D}, rng, "q");
    const Tensor<float> window = bf16_rows({W, D}, rng, "window_kv");
    Tensor<float> sink = bf16_rows({H}, rng, "sink");
    Tensor<uint8_t> storage({count, eb}, "compressed_kv");
    std::vector<int64_t> all(static_cast<size_t>(count));
    for (int64_t e = 0; e < count; ++e) all[static_cast<size_t>(e)] = e;
    reference::write_entries(storage, fmt, all, bf16_rows({count, D}, rng, "latents"));
    Tensor<int32_t> idx({T, K}, "idxs");
    std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(W + count - 1));
    for (int32_t& r : idx.data()) r = trial == 3 ? std::min<int32_t>(pick(rng), W - 1) : pick(rng);  // trial 3: no entry named
    for (int64_t k = 0; k < K; ++k) idx.data()[static_cast<size_t>(K + k)] = -1;                 // row 1: -1 only
    idx.data()[2 * K] = idx.data()[2 * K + 1] = std::max<int32_t>(idx.data()[2 * K], -1);         // a repeat
    const CacheRows cache{fmt, D, count, &storage};
    const Tensor<float> whole = reference::sparse_attn(  // the op on every entry: [T, H, D]
        q, reference::concat_kv_rows(window, reference::read_all_entries(cache)), sink.data(), idx, 0.125f);

    Tensor<int32_t> renumbered = idx;
    const std::vector<int64_t> used = reference::compact_attention_rows(renumbered.data(), W, count);
    if (trial == 3) {
      EXPECT_TRUE(used.empty());
    }
    const int64_t U = static_cast<int64_t>(used.size());
    Tensor<uint8_t> read({std::max<int64_t>(U, 1), eb}, "compressed_kv_read");
    for (int64_t i = 0; i < U; ++i) std::memcpy(read.row(i), storage.row(used[static_cast<size_t>(i)]), static_cast<size_t>(eb));
    const Tensor<float> compact = reference::sparse_attn(
        q, reference::concat_kv_rows(window, reference::read_all_entries(CacheRows{fmt, D, U, &read})), sink.data(),
        renumbered, 0.125f);
    // The reference backend's seam op compacts by itself (reference_ops().sparse_attn).
    const Tensor<float> seam = ops.sparse_attn(q, window, cache, sink, idx, 0.125f);

    bool nonzero = false;
    for (float v : whole.data()) {
      ASSERT_FALSE(std::isnan(v));
      nonzero = nonzero || v != 0.0f;
    }
    EXPECT_TRUE(nonzero);
    ASSERT_EQ(whole.data().size(), compact.data().size());
    EXPECT_EQ(std::memcmp(whole.data().data(), compact.data().data(), whole.data().size() * sizeof(float)), 0)
        << "trial " << trial;
    ASSERT_EQ(whole.data().size(), seam.data().size());
    EXPECT_EQ(std::memcmp(whole.data().data(), seam.data().data(), whole.data().size() * sizeof(float)), 0)
        << "trial " << trial << " (the seam)";
  }
  // An index past the rows (a forced or corrupt top-k): the seam gives the op's own error, as the op on
  // every entry does, instead of compacting out of bounds.
  const Tensor<float> q = bf16_rows({1, 2, 32}, rng, "q");
  const Tensor<float> window = bf16_rows({3, 32}, rng, "window_kv");
  const Tensor<float> sink = bf16_rows({2}, rng, "sink");
  const int64_t eb32 = formats::entry_bytes(fmt, 32);
  Tensor<uint8_t> storage({10, eb32}, "compressed_kv");
  std::vector<int64_t> all(10);
  for (int64_t e = 0; e < 10; ++e) all[static_cast<size_t>(e)] = e;
  reference::write_entries(storage, fmt, all, bf16_rows({10, 32}, rng, "latents"));
  for (const int32_t bad : {13, 40, -2}) {
    const Tensor<int32_t> idx({1, 2}, std::vector<int32_t>{0, bad}, "idxs");
    std::string want, got;
    try {
      reference::sparse_attn(q, reference::concat_kv_rows(window, reference::read_all_entries(CacheRows{fmt, 32, 10, &storage})),
                             sink.data(), idx, 0.125f);
    } catch (const Error& e) {
      want = e.what();
    }
    try {
      ops.sparse_attn(q, window, CacheRows{fmt, 32, 10, &storage}, sink, idx, 0.125f);
    } catch (const Error& e) {
      got = e.what();
    }
    EXPECT_FALSE(want.empty()) << "index " << bad << ": the op accepted it";
    EXPECT_EQ(got, want) << "index " << bad;
  }
}

}  // namespace
}  // namespace dsv41::test
