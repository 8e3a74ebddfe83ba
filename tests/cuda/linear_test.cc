// tests/cuda/linear_test.cc: cuda/linear.cu (CudaOps::linear, linear_fp32, grouped_linear) vs
// reference/ops/linear.cc, bit for bit, for every weight dtype on random and odd shapes (T = 1,
// outputs not a multiple of 32, K = 32), adversarial inputs (zeros, large values that saturate
// the act_quant block scale), the reference's errors (a non-bf16 input), and packed F4 weights.
#include <cstring>

#include "formats/minifloat.h"
#include "reference/ops/dtype.h"
#include "reference/ops/linear.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using reference::DType;
using reference::LinearWeight;

struct Shape {
  int64_t T, out, in;
};

class Linear : public ::testing::TestWithParam<DType> {};

TEST_P(Linear, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const Shape s : {Shape{1, 1, 32}, Shape{1, 33, 64}, Shape{3, 70, 96}, Shape{17, 128, 256}, Shape{5, 257, 512}}) {
    const LinearWeight w = random_weight(GetParam(), s.out, s.in);
    for (float scale : {1.0f, 1e-3f, 3e4f}) {
      reference::Tensor<float> x = random_bf16({s.T, s.in}, scale);
      x.at(0, 0) = 0.0f;  // zeros and a zero block are legal
      EXPECT_TRUE(same_bits(reference::linear(x, w), cuda_ops().linear(x, w)))
          << "linear T=" << s.T << " out=" << s.out << " in=" << s.in << " scale " << scale;
      EXPECT_TRUE(same_bits(reference::linear_fp32(x, w), cuda_ops().linear_fp32(x, w)))
          << "linear_fp32 T=" << s.T << " out=" << s.out << " in=" << s.in;
      const reference::Tensor<float> on_device = cuda_ops().upload(x);  // device input, as the model gives
      EXPECT_TRUE(same_bits(reference::linear(x, w), cuda_ops().linear(on_device, w)));
    }
  }
}

TEST_P(Linear, RaisesTheReferenceErrorOnANonBf16Input) {
  DSV41_SKIP_WITHOUT_DEVICE();
  if (GetParam() == DType::kF32) GTEST_SKIP() << "F32 weights take fp32 inputs";
  const LinearWeight w = random_weight(GetParam(), 32, 64);
  reference::Tensor<float> x = random_bf16({2, 64});
  x.at(1, 5) = 1.0f + 1.0f / 1024.0f;  // not a bf16 value
  EXPECT_THROW(cuda_ops().linear(x, w), Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Linear, ::testing::Values(DType::kF8E4M3, DType::kF4, DType::kBF16, DType::kF32),
                         [](const auto& info) {
                           std::string n = reference::dtype_name(info.param);
                           for (char& c : n) c = c == '_' ? 'x' : c;
                           return n;
                         });

// A packed F4 weight (LinearWeight::packed, docs/released-dims.md): the device decodes its bytes
// and gives the bits of the value form, on the device and the host.
TEST(LinearPackedF4, EqualsTheValueFormBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const Shape s : {Shape{1, 1, 32}, Shape{3, 70, 96}, Shape{17, 128, 256}, Shape{5, 257, 512}}) {
    const LinearWeight w = random_weight(DType::kF4, s.out, s.in);
    LinearWeight p = w;
    p.w.clear();
    p.packed.assign(static_cast<size_t>(s.out * s.in / 2), 0);
    for (int64_t i = 0; i < s.out * s.in; ++i) {  // the E2M1 code of each value (its magnitude and sign)
      const auto bits = [](float v) {
        uint32_t u = 0;
        std::memcpy(&u, &v, sizeof u);
        return u;
      };
      uint8_t code = 0;  // bit equality: -0 (code 8) is not +0 (code 0)
      while (code < 16 && bits(formats::e2m1_decode(code)) != bits(w.w[static_cast<size_t>(i)])) ++code;
      ASSERT_LT(code, 16);
      p.packed[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(code << ((i & 1) * 4));
    }
    const reference::Tensor<float> x = random_bf16({s.T, s.in}, 1.0f);
    const reference::Tensor<float> want = reference::linear(x, w);
    EXPECT_TRUE(same_bits(want, reference::linear(x, p))) << "host, out=" << s.out << " in=" << s.in;
    EXPECT_TRUE(same_bits(want, cuda_ops().linear(x, p))) << "device, out=" << s.out << " in=" << s.in;
    EXPECT_TRUE(same_bits(reference::linear_fp32(x, w), cuda_ops().linear_fp32(x, p)));
  }
}

TEST(GroupedLinear, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const auto [T, groups, r, width] : {std::array<int64_t, 4>{1, 1, 1, 1}, {3, 2, 5, 33}, {9, 8, 16, 64}}) {
    const LinearWeight w = random_weight(DType::kBF16, groups * r, width);
    const reference::Tensor<float> x = random_bf16({T, groups * width});
    EXPECT_TRUE(same_bits(reference::grouped_linear(x, w, static_cast<int>(groups)),
                          cuda_ops().grouped_linear(x, w, static_cast<int>(groups))))
        << "T=" << T << " groups=" << groups;
  }
}

TEST(LinearShapes, ZeroRowsGiveZeroRows) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const LinearWeight w = random_weight(DType::kF8E4M3, 64, 64);
  EXPECT_TRUE(same_bits(reference::linear(random_bf16({0, 64}), w), cuda_ops().linear(random_bf16({0, 64}), w)));
}

}  // namespace
}  // namespace dsv41::test
