// tests/cuda/mhc_test.cc: cuda/mhc.cu (CudaOps::hc_identity_pre, hc_pre, hc_post, hc_mean) and the
// memory ops (slice_rows, concat_kv_rows, concat_cols, concat_rows, add_markov_bias) vs the
// reference, bit for bit: hc = 1 and 4, one token and odd token counts, zero tokens, exact ties
// (equal copies whose sum rounds at a bf16 midpoint).
#include "reference/attention.h"
#include "reference/dspark.h"
#include "reference/mhc.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

TEST(Mhc, PrePostMeanEqualReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t hc : {1, 4}) {
    for (int64_t T : {0, 1, 5}) {
      const int64_t dim = 96;
      const reference::Tensor<float> stream = random_bf16({T, hc, dim}, 2.0f, "stream");
      reference::Tensor<float> pre({T, hc}, "pre"), post({T, hc}, "post"), comb({T, hc, hc}, "comb");
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (float& v : pre.data()) v = u(rng());
      for (float& v : post.data()) v = 2.0f * u(rng());
      for (float& v : comb.data()) v = u(rng());
      const reference::Tensor<float> f = random_bf16({T, dim}, 1.0f, "f");
      EXPECT_TRUE(same_bits(reference::hc_identity_pre(T, hc), cuda_ops().hc_identity_pre(T, hc)));
      EXPECT_TRUE(same_bits(reference::hc_pre(stream, pre), cuda_ops().hc_pre(stream, pre))) << "hc " << hc;
      EXPECT_TRUE(same_bits(reference::hc_post(f, stream, post, comb), cuda_ops().hc_post(f, stream, post, comb)))
          << "hc " << hc << " T " << T;
      EXPECT_TRUE(same_bits(reference::hc_mean(stream), cuda_ops().hc_mean(stream)));
    }
  }
  // Ties: four equal copies of 1 + 2^-8 (a bf16 midpoint after the mean's division is exact).
  reference::Tensor<float> tie({1, 4, 8}, "tie", 1.0f + 1.0f / 256.0f);
  EXPECT_TRUE(same_bits(reference::hc_mean(tie), cuda_ops().hc_mean(tie)));
}

TEST(MemoryOps, SliceAndConcatEqualReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::Tensor<float> a = random_bf16({5, 8}), b = random_bf16({0, 8}), c = random_bf16({3, 8});
  EXPECT_TRUE(same_bits(reference::slice_rows(a, 1, 3), cuda_ops().slice_rows(cuda_ops().upload(a), 1, 3)));
  EXPECT_TRUE(same_bits(reference::slice_rows(a, 5, 0), cuda_ops().slice_rows(cuda_ops().upload(a), 5, 0)));
  EXPECT_THROW(cuda_ops().slice_rows(cuda_ops().upload(a), 4, 2), Error);
  EXPECT_TRUE(same_bits(reference::concat_kv_rows(a, b), cuda_ops().concat_kv_rows(a, b)));
  EXPECT_TRUE(same_bits(reference::concat_kv_rows(a, c), cuda_ops().concat_kv_rows(cuda_ops().upload(a), c)));
  EXPECT_TRUE(same_bits(reference::concat_rows({a, b, c}), cuda_ops().concat_rows({a, b, c})));
  const reference::Tensor<float> d = random_bf16({5, 3});
  EXPECT_TRUE(same_bits(reference::concat_cols({a, d}), cuda_ops().concat_cols({a, d})));
  reference::Tensor<float> logits = random_bf16({3, 8}), bias = random_bf16({1, 8});
  reference::Tensor<float> got = cuda_ops().upload(logits);
  reference::add_markov_bias(logits, 2, bias);
  cuda_ops().add_markov_bias(got, 2, bias);
  EXPECT_TRUE(same_bits(logits, std::move(got)));
}

}  // namespace
}  // namespace dsv41::test
