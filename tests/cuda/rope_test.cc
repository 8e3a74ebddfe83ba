// tests/cuda/rope_test.cc: cuda/rope.cu (CudaOps::rope_rows) and cuda/embedding.cu (CudaOps::embed)
// vs the reference, bit for bit: both RoPE kinds of the tiny config (window, and YaRN compressed),
// forward and inverse, one head and several, strided positions, the last position of the table;
// the reference's error on a position outside the table.
#include "reference/ops/config.h"
#include "reference/ops/embedding.h"
#include "reference/ops/rope.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

TEST(RopeRows, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::ModelConfig c = reference::load_config_preset("tiny");
  for (reference::RopeKind kind : {reference::RopeKind::kWindow, reference::RopeKind::kCompressed}) {
    const reference::RopeTable rope = reference::RopeTable::make(c, kind);
    const int64_t rd = rope.rope_dim();
    struct Case {
      int64_t T, heads, width, first, stride;
    };
    for (const Case k : {Case{1, 1, rd, 0, 1}, Case{5, 3, rd + 6, 7, 1}, Case{9, 2, 2 * rd, 4, 4},
                         Case{1, 4, rd, rope.max_seq_len() - 1, 1}}) {
      for (bool inverse : {false, true}) {
        reference::Tensor<float> want = random_bf16({k.T, k.heads * k.width}, 2.0f);
        reference::Tensor<float> got = cuda_ops().upload(want);
        reference::rope_rows(want, k.heads, rope, k.first, k.stride, inverse);
        cuda_ops().rope_rows(got, k.heads, rope, k.first, k.stride, inverse);
        EXPECT_TRUE(same_bits(want, std::move(got)))
            << reference::name(kind) << " T=" << k.T << " heads=" << k.heads << " first=" << k.first
            << " inverse=" << inverse;
      }
    }
    reference::Tensor<float> x = cuda_ops().upload(random_bf16({2, rd}));
    EXPECT_THROW(cuda_ops().rope_rows(x, 1, rope, rope.max_seq_len() - 1, 1, false), Error);
  }
}

TEST(Embed, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::Tensor<float> table = random_bf16({50, 24}, 1.0f, "embed");
  for (const std::vector<int64_t>& tokens : {std::vector<int64_t>{}, {0}, {49, 0, 7, 7, 12}}) {
    for (int64_t hc : {1, 4}) {
      EXPECT_TRUE(same_bits(reference::embed(tokens, table, hc), cuda_ops().embed(tokens, table, hc)));
    }
  }
  EXPECT_THROW(cuda_ops().embed({50}, table, 1), Error);
}

}  // namespace
}  // namespace dsv41::test
