// tests/cuda/rmsnorm_test.cc: cuda/rmsnorm.cu (CudaOps::rms_norm) vs reference/ops/rmsnorm.cc, bit for
// bit: row lengths 1 .. 7 (the scalar sum), 8 .. 40 (lanes + tail), the model's widths, long rows
// (the cascade's levels), zero rows, tiny and huge magnitudes; the reference's error on a bad weight.
#include "reference/ops/rmsnorm.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

TEST(RmsNorm, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  std::vector<int64_t> widths;
  for (int64_t n = 1; n <= 40; ++n) widths.push_back(n);
  for (int64_t n : {63, 64, 127, 256, 512, 1000, 4096, 7168, 20000}) widths.push_back(n);
  for (int64_t n : widths) {
    for (float scale : {1.0f, 1e-20f, 1e18f}) {
      const reference::Tensor<float> x = random_bf16({3, n}, scale), w = random_bf16({n}, 1.0f, "w");
      EXPECT_TRUE(same_bits(reference::rms_norm(x, w.data(), 1e-6), cuda_ops().rms_norm(x, w, 1e-6)))
          << "n=" << n << " scale " << scale;
    }
  }
}

TEST(RmsNorm, ZeroRowsAndRank3) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::Tensor<float> w = random_bf16({64}, 1.0f, "w");
  EXPECT_TRUE(same_bits(reference::rms_norm(random_bf16({0, 64}), w.data(), 1e-6),
                        cuda_ops().rms_norm(random_bf16({0, 64}), w, 1e-6)));
  const reference::Tensor<float> x({2, 3, 64}, "zeros");  // all zero: rsqrt(eps)
  EXPECT_TRUE(same_bits(reference::rms_norm(x, w.data(), 1e-6), cuda_ops().rms_norm(x, w, 1e-6)));
}

TEST(RmsNorm, RaisesTheReferenceErrorOnAWeightOfAnotherWidth) {
  DSV41_SKIP_WITHOUT_DEVICE();
  EXPECT_THROW(cuda_ops().rms_norm(random_bf16({2, 64}), random_bf16({32}), 1e-6), Error);
}

}  // namespace
}  // namespace dsv41::test
