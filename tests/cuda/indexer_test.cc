// tests/cuda/indexer_test.cc: CudaOps::index_weights and CudaOps::index_scores (cuda/indexer.cu)
// vs the reference ops, bit for bit: one and odd query counts, one and several index heads, index
// key dims 64 and 128 (FP4 index-key cache entries unpacked on the device), no keys, one key,
// reach 0 (a row of -inf), reach N, negative dots (relu), a zero query (every score 0: exact ties);
// a reach beyond N raises the reference's error.
#include "formats/cache_format.h"
#include "reference/indexer.h"
#include "reference/kv_quant.h"
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

Keys make_keys(int64_t n, int64_t dim) {
  Keys k;
  k.dim = dim;
  k.count = n;
  k.host = reference::Tensor<uint8_t>({n + 3, formats::entry_bytes(CacheFormat::kIndexKeysFp4, static_cast<int>(dim))},
                                      "index_keys");
  std::vector<int64_t> entries(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) entries[static_cast<size_t>(i)] = i;
  reference::write_entries(k.host, CacheFormat::kIndexKeysFp4, entries, random_bf16({n, dim}, 1.0f, "keys"));
  k.device = cuda_ops().upload(k.host);
  return k;
}

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

}  // namespace
}  // namespace dsv41::test
