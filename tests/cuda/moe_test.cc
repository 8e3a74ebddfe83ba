// tests/cuda/moe_test.cc: CudaOps::moe_gate and CudaOps::moe_experts (the linears on the device,
// the reference's transcendental steps on the host, cuda/moe.cu's accumulation) vs the reference
// ops, bit for bit: one and odd token counts, k = 1 and several experts, the SwiGLU clamp on and
// off, exact ties of the biased scores (a zero gate: every expert equal, the lower index wins;
// equal biases), a routing that lists one expert twice for a token and one with an expert index
// outside [0, E) (a hook's replacement: the reference adds in list order and skips the unknown).
#include "reference/ops/config.h"
#include "reference/ops/moe.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using reference::DType;

constexpr int64_t kDim = 64, kInter = 32, kExperts = 8;

reference::ModelConfig moe_config(int k, double swiglu_limit) {
  reference::ModelConfig c = reference::load_config_preset("tiny");
  c.n_activated_experts = k;
  c.dspark_n_activated_experts = 0;
  c.score_func = reference::ScoreFunc::kSqrtSoftplus;
  c.gate_temp = 1.5;
  c.norm_topk_prob = true;
  c.route_scale = 2.5;
  c.swiglu_limit = swiglu_limit;
  return c;
}

reference::MoeWeights random_moe() {
  reference::MoeWeights w;
  w.gate = random_weight(DType::kBF16, kExperts, kDim);
  w.gate_bias = reference::Tensor<float>({kExperts}, "gate.bias");
  std::normal_distribution<float> n(0.0f, 0.1f);
  for (float& v : w.gate_bias.data()) v = n(rng());
  for (int64_t e = 0; e < kExperts; ++e) {
    w.w1.push_back(random_weight(DType::kF4, kInter, kDim));
    w.w2.push_back(random_weight(DType::kF4, kDim, kInter));
    w.w3.push_back(random_weight(DType::kF4, kInter, kDim));
  }
  w.s_w1 = random_weight(DType::kF8E4M3, kInter, kDim);
  w.s_w2 = random_weight(DType::kF8E4M3, kDim, kInter);
  w.s_w3 = random_weight(DType::kF8E4M3, kInter, kDim);
  return w;
}

::testing::AssertionResult same_routing(const reference::MoeRouting& want, reference::MoeRouting got) {
  auto r = same_bits(want.experts, std::move(got.experts));
  if (!r) return r << " (experts)";
  r = same_bits(want.weights, std::move(got.weights));
  if (!r) return r << " (weights)";
  r = same_bits(want.scores, std::move(got.scores));
  if (!r) return r << " (scores)";
  return ::testing::AssertionSuccess();
}

TEST(Moe, GateAndExpertsEqualReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::MoeWeights w = random_moe();
  for (int k : {1, 3}) {
    for (double limit : {0.0, 0.75}) {
      const reference::ModelConfig c = moe_config(k, limit);
      for (int64_t T : {1, 5, 17}) {
        const reference::Tensor<float> x = random_bf16({T, kDim}, 1.0f, "x");
        const reference::MoeRouting want = ref_ops().moe_gate(x, w, c, 0);
        EXPECT_TRUE(same_routing(want, cuda_ops().moe_gate(x, w, c, 0))) << "k " << k << " T " << T;
        EXPECT_TRUE(same_bits(ref_ops().moe_experts(x, w, want, c), cuda_ops().moe_experts(x, w, want, c)))
            << "k " << k << " limit " << limit << " T " << T;
        // The model's path: device input and device routing.
        const reference::MoeRouting dev_r = cuda_ops().moe_gate(cuda_ops().upload(x), w, c, 0);
        EXPECT_TRUE(same_bits(ref_ops().moe_experts(x, w, want, c), cuda_ops().moe_experts(cuda_ops().upload(x), w,
                                                                                            dev_r, c)));
      }
    }
  }
}

TEST(Moe, TiedScoresTakeTheLowerExpert) {
  DSV41_SKIP_WITHOUT_DEVICE();
  reference::MoeWeights w = random_moe();
  const reference::ModelConfig c = moe_config(3, 0.0);
  const reference::Tensor<float> x = random_bf16({4, kDim}, 1.0f, "x");
  std::fill(w.gate.w.begin(), w.gate.w.end(), 0.0f);  // every logit 0: all scores equal
  std::fill(w.gate_bias.data().begin(), w.gate_bias.data().end(), 0.0f);
  EXPECT_TRUE(same_routing(ref_ops().moe_gate(x, w, c, 0), cuda_ops().moe_gate(x, w, c, 0)));
  w.gate_bias.data()[5] = 0.25f;  // expert 5 first, then the lower indices among the tied rest
  w.gate_bias.data()[6] = 0.25f;
  EXPECT_TRUE(same_routing(ref_ops().moe_gate(x, w, c, 0), cuda_ops().moe_gate(x, w, c, 0)));
}

TEST(Moe, ReplacedRoutingWithRepeatsAndUnknownExperts) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::MoeWeights w = random_moe();
  const reference::ModelConfig c = moe_config(3, 0.5);
  const reference::Tensor<float> x = random_bf16({3, kDim}, 1.0f, "x");
  reference::MoeRouting r = ref_ops().moe_gate(x, w, c, 0);
  r.experts.at(0, 0) = 2;
  r.experts.at(0, 1) = 2;  // expert 2 twice for token 0
  r.experts.at(1, 2) = -1;  // no such expert: skipped
  r.experts.at(2, 0) = static_cast<int32_t>(kExperts);
  EXPECT_TRUE(same_bits(ref_ops().moe_experts(x, w, r, c), cuda_ops().moe_experts(x, w, r, c)));
}

}  // namespace
}  // namespace dsv41::test
