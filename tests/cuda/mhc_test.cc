// tests/cuda/mhc_test.cc: cuda/mhc.cu (CudaOps::hc_identity_pre, hc_pre, hc_post, hc_mean) and the
// memory ops (slice_rows, concat_kv_rows, concat_cols, concat_rows, add_markov_bias) vs the
// reference, bit for bit: hc = 1 and 4, one token and odd token counts, zero tokens, exact ties
// (equal copies whose sum rounds at a bf16 midpoint). HcPostBf16: gpu::hc_post_bf16 (bf16 storage,
// cuda/kernels_bf16.h) vs the reference, and dims that take the vectorised or the scalar kernel.
#include "cuda/kernels_bf16.h"
#include "reference/ops/attention.h"
#include "reference/ops/dspark.h"
#include "reference/ops/mhc.h"
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

// bf16 bit patterns of a tensor of bf16 values, and back.
std::vector<uint16_t> to_bf16_bits(const reference::Tensor<float>& t) {
  std::vector<uint16_t> b(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(bits(t.data()[i]) >> 16);
  return b;
}

TEST(Mhc, HcPostBf16StorageAndVectorisedEqualReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t hc : {1, 4}) {
    for (int64_t dim : {8, 96, 5120, 100}) {  // 100: not a multiple of 8, the scalar kernel (fp32 only)
      for (int64_t T : {1, 3, 17}) {
        reference::Tensor<float> post({T, hc}, "post"), comb({T, hc, hc}, "comb");
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (float& v : post.data()) v = 2.0f * u(rng());
        for (float& v : comb.data()) v = u(rng());
        const reference::Tensor<float> f = random_bf16({T, dim}, 3.0f, "f"), res = random_bf16({T, hc, dim}, 3.0f, "r");
        const reference::Tensor<float> want = reference::hc_post(f, res, post, comb);
        const std::string what = "hc " + std::to_string(hc) + " dim " + std::to_string(dim) + " T " + std::to_string(T);
        EXPECT_TRUE(same_bits(want, cuda_ops().hc_post(f, res, post, comb))) << what;
        if (dim % 8 != 0) continue;
        gpu::DeviceBuffer<uint16_t> df(static_cast<size_t>(f.numel())), dr(static_cast<size_t>(res.numel())),
            dy(static_cast<size_t>(want.numel()));
        gpu::DeviceBuffer<float> dp(static_cast<size_t>(post.numel())), dc(static_cast<size_t>(comb.numel()));
        df.upload(to_bf16_bits(f));
        dr.upload(to_bf16_bits(res));
        dp.upload(post.data());
        dc.upload(comb.data());
        dy.poison();
        gpu::hc_post_bf16(df.get(), dr.get(), dp.get(), dc.get(), T, hc, dim, dy.get());
        EXPECT_EQ(dy.download(), to_bf16_bits(want)) << what << " (bf16 storage)";
      }
    }
  }
  gpu::DeviceBuffer<uint16_t> b(3 * 8);
  EXPECT_THROW(gpu::hc_post_bf16(b.get(), b.get(), nullptr, nullptr, 1, 3, 8, b.get()), Error);  // hc 3
}

}  // namespace
}  // namespace dsv41::test
