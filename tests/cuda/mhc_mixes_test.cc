// tests/cuda/mhc_mixes_test.cc: CudaOps::hc_mixes (cuda/mhc.cu hc_raw_mixes on the device, the
// reference's split + Sinkhorn on the host) vs the reference op, bit for bit: hc = 1 and 4, zero,
// one and odd token counts, widths below 8 (torch's scalar sum path), odd widths, the longest
// modelled width (32764 < 32768), an all-zero stream (r = 1/sqrt(eps)) and equal tokens.
#include "reference/ops/mhc.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

reference::HcWeights random_hc_weights(int64_t hc, int64_t dim) {
  const int64_t n_mix = reference::hc_mix_count(hc);
  reference::HcWeights w{reference::Tensor<float>({n_mix, hc * dim}, "hc_fn"),
                         reference::Tensor<float>({n_mix}, "hc_base"), reference::Tensor<float>({3}, "hc_scale")};
  std::normal_distribution<float> d(0.0f, 1.0f);
  const float s = 1.0f / std::sqrt(static_cast<float>(hc * dim));
  for (float& v : w.fn.data()) v = s * d(rng());
  for (float& v : w.base.data()) v = 0.5f * d(rng());
  for (float& v : w.scale.data()) v = 1.0f + 0.25f * d(rng());
  return w;
}

void expect_same_mixes(const reference::Tensor<float>& stream, const reference::HcWeights& w, int iters,
                       const std::string& what) {
  const reference::HcMixes want = ref_ops().hc_mixes(stream, w, 1e-6, iters, 1e-6);
  reference::HcMixes got = cuda_ops().hc_mixes(stream, w, 1e-6, iters, 1e-6);
  EXPECT_TRUE(same_bits(want.pre, std::move(got.pre))) << what << " pre";
  EXPECT_TRUE(same_bits(want.post, std::move(got.post))) << what << " post";
  EXPECT_TRUE(same_bits(want.comb, std::move(got.comb))) << what << " comb";
}

TEST(HcMixes, EqualReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t hc : {1, 4}) {
    for (int64_t dim : {1, 7, 96, 257}) {
      const reference::HcWeights w = random_hc_weights(hc, dim);
      for (int64_t T : {0, 1, 5}) {
        const reference::Tensor<float> stream = random_bf16({T, hc, dim}, 2.0f, "stream");
        for (int iters : {1, 20}) {
          expect_same_mixes(stream, w, iters,
                            "hc " + std::to_string(hc) + " dim " + std::to_string(dim) + " T " + std::to_string(T));
        }
      }
    }
  }
}

TEST(HcMixes, AdversarialStreams) {
  DSV41_SKIP_WITHOUT_DEVICE();
  {  // the longest width the reference models: 4 x 8191 = 32764 values per token
    const reference::HcWeights w = random_hc_weights(4, 8191);
    expect_same_mixes(random_bf16({3, 4, 8191}, 1.0f, "stream"), w, 20, "width 32764");
  }
  const reference::HcWeights w = random_hc_weights(4, 64);
  expect_same_mixes(reference::Tensor<float>({2, 4, 64}, "zeros", 0.0f), w, 20, "all-zero stream");
  reference::Tensor<float> same = random_bf16({1, 4, 64}, 1.0f, "one");
  reference::Tensor<float> rows({6, 4, 64}, "equal tokens");
  for (int64_t t = 0; t < 6; ++t) std::copy(same.data().begin(), same.data().end(), rows.row(t, 0));
  expect_same_mixes(rows, w, 20, "equal tokens");
  reference::Tensor<float> big({2, 4, 64}, "large", 1.0e19f);  // the sum of squares overflows: r = 0
  expect_same_mixes(big, w, 20, "overflowing squares");
}

}  // namespace
}  // namespace dsv41::test
