// tests/cuda/indexer_test.cc: CudaOps::index_weights and CudaOps::index_scores (cuda/indexer.cu)
// vs the reference ops, bit for bit: one and odd query counts, one and several index heads, index
// key dims 64 and 128 (FP4 index-key cache entries unpacked on the device), no keys, one key,
// reach 0 (a row of -inf), reach N, negative dots (relu), a zero query (every score 0: exact ties);
// a reach beyond N raises the reference's error. FP4-QDQ queries (the model's qdq(kIndexKeysFp4, q))
// take the int8 tensor-core path for every pair (gpu::index_scores_last_path says so); queries and
// keys it cannot encode exactly (not QDQ values, exponents out of range, block scales spanning more
// than the int8 codes hold, extreme weights) take the double path, mixed in one call.
#include <cmath>

#include "cuda/kernels.h"
#include "formats/cache_format.h"
#include "reference/ops/indexer.h"
#include "reference/ops/kv_quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using formats::CacheFormat;

struct Keys {
  reference::Tensor<uint8_t> host;
  reference::Tensor<uint8_t> device;
  int64_t dim = 0, count = 0;
  reference::CacheRows host_rows() const { return {CacheFormat::kIndexKeysFp4, dim, count, &host}; }
  reference::CacheRows device_rows() const { return {CacheFormat::kIndexKeysFp4, dim, count, &device}; }
};

Keys make_keys(const reference::Tensor<float>& rows) {
  const int64_t n = rows.dim(0), dim = rows.dim(1);
  Keys k;
  k.dim = dim;
  k.count = n;
  k.host = reference::Tensor<uint8_t>({n + 3, formats::entry_bytes(CacheFormat::kIndexKeysFp4, static_cast<int>(dim))},
                                      "index_keys");
  std::vector<int64_t> entries(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) entries[static_cast<size_t>(i)] = i;
  reference::write_entries(k.host, CacheFormat::kIndexKeysFp4, entries, rows);
  k.device = cuda_ops().upload(k.host);
  return k;
}

Keys make_keys(int64_t n, int64_t dim) { return make_keys(random_bf16({n, dim}, 1.0f, "keys")); }

std::vector<int64_t> random_reach(int64_t T, int64_t n) {
  std::vector<int64_t> reach(static_cast<size_t>(T));
  std::uniform_int_distribution<int64_t> r(0, n);
  for (int64_t& v : reach) v = r(rng());
  std::sort(reach.begin(), reach.end());
  if (T > 1) {
    reach.front() = 0;
    reach.back() = n;
  }
  return reach;
}

TEST(IndexWeights, EqualReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t T : {0, 1, 5}) {
    for (int64_t heads : {1, 7, 64}) {
      const reference::Tensor<float> proj = random_bf16({T, heads}, 3.0f, "proj");
      for (int di : {64, 128}) {
        EXPECT_TRUE(same_bits(ref_ops().index_weights(proj, di), cuda_ops().index_weights(proj, di)));
      }
    }
  }
  EXPECT_THROW(cuda_ops().index_weights(random_bf16({2, 4}), 0), Error);
}

TEST(IndexScores, EqualReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t dim : {64, 128}) {
    for (int64_t n : {0, 1, 5, 33}) {
      const Keys keys = make_keys(n, dim);
      for (int64_t T : {1, 3, 7}) {
        for (int64_t heads : {1, 4}) {
          const reference::Tensor<float> q = random_bf16({T, heads, dim}, 1.0f, "q");
          const reference::Tensor<float> w = random_bf16({T, heads}, 0.5f, "w");
          const std::vector<int64_t> reach = random_reach(T, n);
          const reference::Tensor<float> want = ref_ops().index_scores(q, keys.host_rows(), w, reach);
          EXPECT_TRUE(same_bits(want, cuda_ops().index_scores(q, keys.device_rows(), w, reach)))
              << "dim " << dim << " n " << n << " T " << T << " heads " << heads;
          EXPECT_TRUE(same_bits(want, cuda_ops().index_scores(cuda_ops().upload(q), keys.device_rows(),
                                                              cuda_ops().upload(w), reach)));
        }
      }
    }
  }
}

TEST(IndexScores, TiesAndErrors) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Keys keys = make_keys(9, 64);
  const reference::Tensor<float> zero({2, 4, 64}, "q", 0.0f);
  const reference::Tensor<float> w = random_bf16({2, 4}, 0.5f, "w");
  EXPECT_TRUE(same_bits(ref_ops().index_scores(zero, keys.host_rows(), w, {4, 9}),
                        cuda_ops().index_scores(zero, keys.device_rows(), w, {4, 9})));
  EXPECT_THROW(cuda_ops().index_scores(zero, keys.device_rows(), w, {4, 10}), Error);
  EXPECT_THROW(cuda_ops().index_scores(zero, keys.device_rows(), w, {4}), Error);
}

// q as the model feeds it: FP4 QDQ (E2M1 codes, E8M0 scales per 32 channels).
reference::Tensor<float> qdq_q(int64_t T, int64_t heads, int64_t dim) {
  return ref_ops().qdq(CacheFormat::kIndexKeysFp4, random_bf16({T, heads, dim}, 1.0f, "q"));
}

// The model's weights: bf16(proj * Di^-0.5 * Hi^-0.5).
reference::Tensor<float> model_w(int64_t T, int64_t heads, int64_t dim) {
  return ref_ops().index_weights(random_bf16({T, heads}, 2.0f, "proj"), static_cast<int>(dim));
}

// Scores that are not all -inf, zero or NaN: some finite nonzero values and some exact zeros
// (ties) where `ties` is set.
void expect_nontrivial(const reference::Tensor<float>& s, bool ties) {
  int64_t nonzero = 0, zero = 0;
  for (float v : s.data()) {
    ASSERT_FALSE(std::isnan(v));
    if (std::isfinite(v) && v != 0.0f) ++nonzero;
    if (v == 0.0f) ++zero;
  }
  EXPECT_GT(nonzero, 0);
  if (ties) {
    EXPECT_GT(zero, 0);
  }
}

void expect_path(int64_t slow_queries, int64_t slow_keys) {
  const gpu::IndexScoresPath p = gpu::index_scores_last_path();
  EXPECT_TRUE(p.mma);
  EXPECT_EQ(p.slow_queries, slow_queries);
  EXPECT_EQ(p.slow_keys, slow_keys);
}

TEST(IndexScores, Fp4QdqTakesTheTensorCorePathBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  struct Shape {
    int64_t T, n;
  };
  for (int64_t dim : {64, 128}) {
    for (int64_t heads : {1, 4, 32}) {
      for (Shape sh : {Shape{1, 1}, Shape{5, 130}, Shape{13, 300}, Shape{67, 257}}) {
        reference::Tensor<float> q = qdq_q(sh.T, heads, dim);
        for (int64_t c = 0; c < dim; ++c) q.at(0, 0, c) = 0.0f;  // an all-zero head row
        reference::Tensor<float> rows = random_bf16({sh.n, dim}, 1.0f, "keys");
        if (sh.n > 2) {
          for (int64_t c = 0; c < dim; ++c) rows.at(1, c) = 0.0f;  // an all-zero key: scores 0 (ties)
        }
        const Keys keys = make_keys(rows);
        const reference::Tensor<float> w = model_w(sh.T, heads, dim);
        const std::vector<int64_t> reach = random_reach(sh.T, sh.n);
        const reference::Tensor<float> want = ref_ops().index_scores(q, keys.host_rows(), w, reach);
        const reference::Tensor<float> got =
            cuda_ops().download(cuda_ops().index_scores(q, keys.device_rows(), w, reach));
        EXPECT_TRUE(same_bits(want, got)) << "dim " << dim << " heads " << heads << " T " << sh.T << " n " << sh.n;
        expect_path(0, 0);
        if (sh.n > 2) expect_nontrivial(got, true);
      }
    }
  }
}

TEST(IndexScores, QueriesAndKeysOffTheTensorCorePathBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const int64_t T = 21, heads = 32, dim = 128, n = 200;
  reference::Tensor<float> q = qdq_q(T, heads, dim);
  reference::Tensor<float> w = model_w(T, heads, dim);
  for (int64_t c = 0; c < 32; ++c) q.at(2, 5, c) *= 0x1p20f;  // block scales 2^20 apart in one head row
  for (int64_t c = 0; c < dim; ++c) q.at(4, 31, c) *= 0x1p40f;  // a row exponent beyond 2^30
  w.at(6, 0) = 0x1p-60f;                                          // a weight beyond 2^-40
  q.at(8, 9, 3) = 1.0078125f;  // 1 + 2^-7: significand 129, not an int8 code (not a QDQ value)
  reference::Tensor<float> rows = random_bf16({n, dim}, 1.0f, "keys");
  for (int64_t c = 32; c < 64; ++c) rows.at(3, c) *= 0x1p20f;    // key block scales 2^20 apart
  for (int64_t c = 0; c < dim; ++c) rows.at(7, c) *= 0x1p-40f;   // a key exponent below 2^-30
  for (int64_t c = 0; c < dim; ++c) rows.at(11, c) = 0.0f;        // an all-zero key: scores 0 (ties)
  const Keys keys = make_keys(rows);
  std::vector<int64_t> reach = random_reach(T, n);
  reach[8] = reach[9] = n;
  const reference::Tensor<float> want = ref_ops().index_scores(q, keys.host_rows(), w, reach);
  const reference::Tensor<float> got = cuda_ops().download(cuda_ops().index_scores(q, keys.device_rows(), w, reach));
  EXPECT_TRUE(same_bits(want, got));
  expect_path(4, 2);
  expect_nontrivial(got, true);

  // Not QDQ at all (bf16 q): every query on the double path.
  const reference::Tensor<float> q_bf16 = random_bf16({T, heads, dim}, 1.0f, "q");
  EXPECT_TRUE(same_bits(ref_ops().index_scores(q_bf16, keys.host_rows(), w, reach),
                        cuda_ops().index_scores(q_bf16, keys.device_rows(), w, reach)));
  EXPECT_EQ(gpu::index_scores_last_path().slow_queries, T);

  // More than 32 heads: no tensor-core path for the shape.
  const reference::Tensor<float> q40 = qdq_q(3, 40, dim), w40 = model_w(3, 40, dim);
  const std::vector<int64_t> reach3 = {0, 100, n};
  EXPECT_TRUE(same_bits(ref_ops().index_scores(q40, keys.host_rows(), w40, reach3),
                        cuda_ops().index_scores(q40, keys.device_rows(), w40, reach3)));
  EXPECT_FALSE(gpu::index_scores_last_path().mma);
}

}  // namespace
}  // namespace dsv41::test
