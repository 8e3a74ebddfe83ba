// tests/cuda/attention_test.cc: CudaOps::sparse_attn (cuda/attention.cu's tiled scores, softmax
// and P.V) and CudaOps::attention_index_rows vs the reference ops, bit for bit: one query and odd
// query counts, one and five heads, index rows of length 0, 1, 63, 64, 65 and 130 (a block
// boundary on each side), rows of only -1, repeated indices (exact ties between scores), large
// scores (the running max moves between blocks), with and without a compressed FP4 part; an index
// outside [-1, N) raises the reference's error. TiledShapes stresses the kernels' 64-head x
// 128-column tiles and 16-step stages: K and D not multiples of the tiles (and D, K not multiples
// of 4: the scalar copy path), heads above one tile, mostly -1 rows, T not a multiple of s_q 4.
#include <limits>

#include "formats/cache_format.h"
#include "reference/ops/attention.h"
#include "reference/ops/kv_quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using formats::CacheFormat;

reference::Tensor<int32_t> random_idxs(int64_t T, int64_t K, int64_t n, double minus_one) {
  reference::Tensor<int32_t> idx({T, K}, "idxs");
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(n) - 1);
  std::bernoulli_distribution none(minus_one);
  for (int32_t& v : idx.data()) v = (n == 0 || none(rng())) ? -1 : row(rng());
  return idx;
}

struct Case {
  int64_t T, H, D, K, window_rows, compressed_rows;
  float q_scale;
};

void check_case(const Case& c, double minus_one, const std::string& what) {
  const reference::Tensor<float> q = random_bf16({c.T, c.H, c.D}, c.q_scale, "q");
  const reference::Tensor<float> window = random_bf16({c.window_rows, c.D}, 1.0f, "window_kv");
  const reference::Tensor<float> sink = random_bf16({c.H}, 1.0f, "sink");
  const CacheFormat f = CacheFormat::kCompressedKvFp4;
  // No compressed part: an unused one-byte storage (the FP4 format needs D % 32 == 0).
  const int64_t eb = c.compressed_rows > 0 ? formats::entry_bytes(f, static_cast<int>(c.D)) : 1;
  reference::Tensor<uint8_t> storage({c.compressed_rows + 2, eb}, "compressed");
  if (c.compressed_rows > 0) {
    std::vector<int64_t> entries(static_cast<size_t>(c.compressed_rows));
    for (int64_t i = 0; i < c.compressed_rows; ++i) entries[static_cast<size_t>(i)] = i;
    reference::write_entries(storage, f, entries, random_bf16({c.compressed_rows, c.D}, 1.0f, "latents"));
  }
  const reference::CacheRows rows{f, c.D, c.compressed_rows, &storage};
  const reference::Tensor<int32_t> idxs = random_idxs(c.T, c.K, c.window_rows + c.compressed_rows, minus_one);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const reference::Tensor<float> want = ref_ops().sparse_attn(q, window, rows, sink, idxs, scale);
  EXPECT_TRUE(same_bits(want, cuda_ops().sparse_attn(q, window, rows, sink, idxs, scale))) << what;
  // The same on device inputs (the model's path).
  const reference::Tensor<uint8_t> dstorage = cuda_ops().upload(storage);
  const reference::CacheRows drows{f, c.D, c.compressed_rows, &dstorage};
  EXPECT_TRUE(same_bits(want, cuda_ops().sparse_attn(cuda_ops().upload(q), cuda_ops().upload(window), drows,
                                                     cuda_ops().upload(sink), cuda_ops().upload(idxs), scale)))
      << what << " (device inputs)";
}

TEST(SparseAttn, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t T : {1, 3}) {
    for (int64_t H : {1, 5}) {
      for (int64_t K : {0, 1, 63, 64, 65, 130}) {
        for (int64_t comp : {0, 7}) {
          const Case c{T, H, 64, K, 9, comp, 1.0f};
          const std::string what = "T " + std::to_string(T) + " H " + std::to_string(H) + " K " + std::to_string(K) +
                                   " compressed " + std::to_string(comp);
          check_case(c, 0.2, what);
          check_case(c, 1.0, what + " all -1");
        }
      }
    }
  }
  check_case(Case{2, 3, 512, 200, 130, 70, 1.0f}, 0.1, "D 512");
  check_case(Case{2, 3, 64, 130, 40, 0, 8.0f}, 0.0, "large scores");
}

TEST(SparseAttn, TiledShapes) {
  DSV41_SKIP_WITHOUT_DEVICE();
  // {T, H, D, K, window rows, compressed rows, q scale}, fraction of -1 indices
  check_case(Case{5, 64, 512, 300, 200, 150, 1.0f}, 0.1, "H 64 D 512 K 300 (2 full j tiles + 44)");
  check_case(Case{4, 64, 512, 640, 128, 512, 4.0f}, 0.0, "the decode shape, large scores");
  check_case(Case{3, 65, 130, 203, 120, 0, 1.0f}, 0.7, "H 65 D 130 K 203 (scalar copies), 70% -1");
  check_case(Case{7, 100, 256, 129, 40, 40, 2.0f}, 0.95, "H 100 D 256 K 129, 95% -1");
  check_case(Case{6, 16, 96, 644, 300, 0, 1.0f}, 0.5, "H 16 D 96 K 644");
  check_case(Case{2, 3, 1, 70, 5, 0, 1.0f}, 0.2, "D 1");
  check_case(Case{1, 128, 200, 17, 18, 0, 1.0f}, 0.3, "H 128 (two head tiles) D 200 K 17");
}

TEST(SparseAttn, TiesAndRepeatedRows) {
  DSV41_SKIP_WITHOUT_DEVICE();
  // Every index reads the same row, or two rows alternately: equal scores in every block.
  const reference::Tensor<float> q = random_bf16({2, 2, 64}, 1.0f, "q");
  const reference::Tensor<float> window = random_bf16({3, 64}, 1.0f, "window_kv");
  const reference::Tensor<float> sink = random_bf16({2}, 1.0f, "sink");
  reference::Tensor<uint8_t> storage({1, formats::entry_bytes(CacheFormat::kCompressedKvFp4, 64)}, "c");
  const reference::CacheRows none{CacheFormat::kCompressedKvFp4, 64, 0, &storage};
  reference::Tensor<int32_t> idxs({2, 129}, "idxs");
  for (int64_t j = 0; j < 129; ++j) {
    idxs.at(0, j) = 1;
    idxs.at(1, j) = static_cast<int32_t>(j % 2 == 0 ? 0 : 2);
  }
  EXPECT_TRUE(same_bits(ref_ops().sparse_attn(q, window, none, sink, idxs, 0.125f),
                        cuda_ops().sparse_attn(q, window, none, sink, idxs, 0.125f)));
  idxs.at(1, 5) = 3;  // outside [-1, 3): the reference's error
  EXPECT_THROW(cuda_ops().sparse_attn(q, window, none, sink, idxs, 0.125f), Error);
}

TEST(AttentionIndexRows, EqualsReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t T : {0, 1, 4}) {
    for (int64_t kw : {0, 3}) {
      for (int64_t kt : {0, 1, 5}) {
        const reference::Tensor<int32_t> window = random_idxs(T, kw, 17, 0.3);
        const reference::Tensor<int32_t> topk = random_idxs(T, kt, 9, 0.3);
        for (int64_t width : {kt, kt + 4}) {
          EXPECT_TRUE(same_bits(ref_ops().attention_index_rows(window, topk, 11, width),
                                cuda_ops().attention_index_rows(window, topk, 11, width)))
              << "T " << T << " kw " << kw << " kt " << kt << " width " << width;
        }
      }
    }
  }
  EXPECT_THROW(cuda_ops().attention_index_rows(random_idxs(2, 3, 5, 0.0), random_idxs(2, 4, 5, 0.0), 0, 3), Error);
}

}  // namespace
}  // namespace dsv41::test
