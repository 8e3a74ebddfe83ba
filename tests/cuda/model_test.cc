// tests/cuda/model_test.cc: the whole forward on CudaOps (reference::model::Model over gpu::CudaOps) on the
// tiny oracle (golden/oracle), against the reference Model: a 333-token prefill, a chunked
// continuation and decode steps, every logit and every recorded selection bit for bit (every ported
// op is bit-exact and every fallback is the reference, so the bound is zero). Then the `cuda-exact`
// scenario backend: a session saved on it resumes on ref (and back) with the same bytes; and the
// production `cuda` backend (order-variant): its claim, finite logits close to the reference's,
// its F8 linears on the production kernel. Prints which ops ran on the GPU and how many calls fell
// back to the host.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "reference/model/model.h"
#include "scenarios/runner/backend.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/oracle_model.h"

namespace dsv41::test {
namespace {

void expect_same(const reference::model::StepRecord& a, const reference::model::StepRecord& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_EQ(bits(a.logits[i]), bits(b.logits[i])) << what << ": first differing logit " << i;
  }
  const auto same = [&](const auto& x, const auto& y, const char* name) {
    ASSERT_EQ(x.size(), y.size()) << what << " " << name;
    for (const auto& [l, t] : x) EXPECT_TRUE(same_bits(t, y.at(l))) << what << " " << name << " layer " << l;
  };
  same(a.topk, b.topk, "topk");
  same(a.candidates, b.candidates, "candidates");
  same(a.engram_ids, b.engram_ids, "engram_ids");
  same(a.experts, b.experts, "experts");
}

TEST(CudaModel, OracleForwardEqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const OracleModel& o = oracle_model();
  cuda_ops().reset_counts();
  reference::model::Model ref(o.config, o.model->weights(), o.token_map);
  reference::model::Model dev(o.config, o.model->weights(), o.token_map, cuda_ops());
  reference::model::ModelState sr = ref.new_state(), sd = dev.new_state();
  expect_same(ref.prefill(sr, o.tokens), dev.prefill(sd, o.tokens), "prefill 333");
  const std::vector<int64_t> next = {5, 17, 3, 250, 9};
  expect_same(ref.forward_chunk(sr, {next[0], next[1]}), dev.forward_chunk(sd, {next[0], next[1]}), "chunk of 2");
  for (size_t k = 2; k < next.size(); ++k) {
    expect_same(ref.decode(sr, next[k]), dev.decode(sd, next[k]), "decode " + std::to_string(k));
  }
  std::printf("%-22s %8s %8s\n", "op", "gpu", "host");
  for (const auto& [op, n] : cuda_ops().counts()) {
    std::printf("%-22s %8lld %8lld\n", op.c_str(), static_cast<long long>(n.gpu), static_cast<long long>(n.host));
  }
  EXPECT_GT(cuda_ops().counts()["linear"].gpu, 0);
  EXPECT_EQ(cuda_ops().counts()["linear"].host, 0);
  for (const char* op : {"hc_mixes", "sparse_attn", "attention_index_rows", "engram_lookup", "engram_gate_residual",
                         "moe_gate", "moe_experts", "index_weights", "index_topk", "candidate_blocks"}) {
    EXPECT_EQ(cuda_ops().counts()[op].host, 0) << op;
  }
}

TEST(CudaBackend, SessionSavedOnOneSideResumesOnTheOther) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const OracleModel& o = oracle_model();
  scenarios::runner::BackendResources r{o.config, o.model->weights(), o.token_map};
  auto cuda = scenarios::runner::make_backend("cuda-exact", r);
  auto ref = scenarios::runner::make_backend("ref", r);
  EXPECT_EQ(cuda->claim(), scenarios::runner::Claim::kBitExact);
  EXPECT_EQ(scenarios::runner::backend_claim("cuda-exact"), scenarios::runner::Claim::kBitExact);
  auto sc = cuda->new_session();
  auto sr = ref->new_session();
  const std::vector<int64_t> prompt = oracle_tokens(0, 40);
  expect_same(ref->step(*sr, prompt, {}, {}, 0), cuda->step(*sc, prompt, {}, {}, 0), "backend prefill");
  for (bool swa : {true, false}) {
    const scenarios::runner::SavedState from_cuda = cuda->save(*sc, swa), from_ref = ref->save(*sr, swa);
    ASSERT_EQ(from_cuda.bytes, from_ref.bytes) << "session bytes, include_swa " << swa;
    const auto mode = swa ? reference::session::ResumeMode::kFull : reference::session::ResumeMode::kGlobalOnly;
    auto on_ref = ref->restore(from_cuda, mode);
    auto on_cuda = cuda->restore(from_ref, mode);
    expect_same(ref->step(*on_ref, {7}, {}, {}, 1), cuda->step(*on_cuda, {7}, {}, {}, 1), "after resume");
  }
  const auto a = ref->caches(*sr), b = cuda->caches(*sc);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].bytes, b[i].bytes) << a[i].kind << " layer " << a[i].layer;
}

// The production backend: order-variant by claim; its forward runs (F8 linears on the fp8 tensor
// cores) with finite, not all zero logits; how close they are to the reference's is printed here
// and judged by `dsv41 run --sides ref,cuda` (tolerance; order-variant judging, issue 32).
TEST(CudaBackend, ProductionClaimsOrderVariantAndRuns) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const OracleModel& o = oracle_model();
  scenarios::runner::BackendResources r{o.config, o.model->weights(), o.token_map};
  auto cuda = scenarios::runner::make_backend("cuda", r);
  auto ref = scenarios::runner::make_backend("ref", r);
  EXPECT_EQ(cuda->claim(), scenarios::runner::Claim::kOrderVariant);
  EXPECT_EQ(scenarios::runner::backend_claim("cuda"), scenarios::runner::Claim::kOrderVariant);
  auto sc = cuda->new_session();
  auto sr = ref->new_session();
  const std::vector<int64_t> prompt = oracle_tokens(0, 40);
  const reference::model::StepRecord a = ref->step(*sr, prompt, {}, {}, 0), b = cuda->step(*sc, prompt, {}, {}, 0);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  double max_abs = 0, max_diff = 0;
  int64_t differ = 0;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(b.logits[i])) << "logit " << i;
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(a.logits[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a.logits[i]) - b.logits[i]));
    differ += bits(a.logits[i]) != bits(b.logits[i]);
  }
  double max_b = 0;
  for (float v : b.logits) max_b = std::max(max_b, std::fabs(static_cast<double>(v)));
  ASSERT_GT(max_abs, 0.0);
  EXPECT_GT(max_b, 0.0) << "the production logits are all zero";
  std::printf("production cuda vs ref, 40-token prefill: %lld of %zu logits differ, max |diff| %.3g (max |logit| "
              "%.3g)\n", static_cast<long long>(differ), a.logits.size(), max_diff, max_abs);
}

}  // namespace
}  // namespace dsv41::test
