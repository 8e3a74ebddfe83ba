// tests/cuda/compressor_test.cc: cuda/compressor.cu (CudaOps::compress) vs reference/ops/compressor.cc,
// bit for bit: latents, first_group and both state tensors after every call of a chunked sequence
// (groups split across chunks, one-token decode steps, an empty call, a chunk ending mid-group),
// ratios 2 (released), 3 and 4, widths 1, 7 and 64; adversarial scores (exact ties, spreads that
// underflow exp to 0, values beyond |88| where glibc's expf takes its range checks); the state kept
// on the device (the ops counted as GPU calls) and the host-state fallback; the reference's errors.
#include <limits>

#include "reference/ops/compressor.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using reference::Tensor;

// [T, dim] fp32 scores of a given kind: 0 random N(0, 4), 1 exact ties in pairs, 2 spread over
// +-120 (exp(s - m) underflows for most), 3 near the expf argument limits (s - m in [-104, -87]).
Tensor<float> scores(int64_t T, int64_t dim, int kind) {
  Tensor<float> s({T, dim}, "score");
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::uniform_real_distribution<float> u(-120.0f, 120.0f), lim(87.0f, 104.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < dim; ++c) {
      float v = n(rng());
      if (kind == 1) v = static_cast<float>((t / 2 + c) % 3);
      if (kind == 2) v = u(rng());
      if (kind == 3) v = (t % 2 == 0) ? 0.0f : -lim(rng());
      s.at(t, c) = v;
    }
  }
  return s;
}

Tensor<float> kv_rows(int64_t T, int64_t dim) {
  Tensor<float> x({T, dim}, "kv");
  std::normal_distribution<float> n(0.0f, 1.5f);
  for (float& v : x.data()) v = n(rng());  // fp32 (wkv(x.float()) is not bf16)
  return x;
}

void check_sequence(int ratio, int64_t dim, const std::vector<int64_t>& chunks, int kind) {
  Tensor<float> ks({ratio, dim}, "kv_state", 0.0f);
  Tensor<float> ss({ratio, dim}, "score_state", -std::numeric_limits<float>::infinity());
  Tensor<float> dks = cuda_ops().upload(ks), dss = cuda_ops().upload(ss);
  int64_t pos = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t T = chunks[i];
    const Tensor<float> kv = kv_rows(T, dim), sc = scores(T, dim, kind);
    const reference::CompressedLatents want = reference::compress(kv, sc, pos, ratio, ks, ss);
    const reference::CompressedLatents got =
        cuda_ops().compress(cuda_ops().upload(kv), cuda_ops().upload(sc), pos, ratio, dks, dss);
    const std::string where = "ratio " + std::to_string(ratio) + " dim " + std::to_string(dim) + " kind " +
                              std::to_string(kind) + " call " + std::to_string(i) + " (pos " + std::to_string(pos) +
                              ", T " + std::to_string(T) + ")";
    EXPECT_EQ(got.first_group, want.first_group) << where;
    if (want.count() > 0) {
      bool nonzero = false;
      for (float v : want.latent.data()) nonzero = nonzero || (v != 0.0f && !std::isnan(v));
      EXPECT_TRUE(nonzero) << where << ": the reference's latents are all zero or NaN";
    }
    EXPECT_TRUE(same_bits(want.latent, got.latent)) << where << " latent";
    EXPECT_TRUE(same_bits(ks, dks)) << where << " kv_state";
    EXPECT_TRUE(same_bits(ss, dss)) << where << " score_state";
    pos += T;
  }
}

TEST(Compress, EqualsReferenceBitForBitOverChunkedSequences) {
  DSV41_SKIP_WITHOUT_DEVICE();
  cuda_ops().reset_counts();
  const std::vector<std::vector<int64_t>> sequences = {
      {8, 1, 1, 1, 1},          // a prefill of whole groups, then decode
      {5, 1, 3, 0, 2, 7, 1},    // groups split across chunks, an empty call, a chunk ending mid-group
      {1, 1, 1, 1, 1, 1},       // decode only
      {37}};                    // one odd-length prefill
  for (int ratio : {2, 3, 4}) {
    for (int64_t dim : {1, 7, 64}) {
      for (int kind = 0; kind < 4; ++kind) {
        for (const auto& seq : sequences) check_sequence(ratio, dim, seq, kind);
      }
    }
  }
  const auto counts = cuda_ops().counts();
  ASSERT_TRUE(counts.count("compress"));
  EXPECT_GT(counts.at("compress").gpu, 0);
  EXPECT_EQ(counts.at("compress").host, 0) << "the device-state calls must not fall back";
}

TEST(Compress, HostStateFallsBackAndStillAgrees) {
  DSV41_SKIP_WITHOUT_DEVICE();
  cuda_ops().reset_counts();
  Tensor<float> ks({2, 5}, "kv_state", 0.0f), ss({2, 5}, "score_state", -INFINITY);
  Tensor<float> hks = ks, hss = ss;
  const Tensor<float> kv = kv_rows(3, 5), sc = scores(3, 5, 0);
  const reference::CompressedLatents want = reference::compress(kv, sc, 0, 2, ks, ss);
  const reference::CompressedLatents got = cuda_ops().compress(kv, sc, 0, 2, hks, hss);
  EXPECT_TRUE(same_bits(want.latent, got.latent));
  EXPECT_TRUE(hks.on_host());
  EXPECT_TRUE(same_bits(ks, cuda_ops().upload(hks)));
  EXPECT_EQ(cuda_ops().counts().at("compress").host, 1);
}

TEST(Compress, RaisesTheReferenceErrors) {
  DSV41_SKIP_WITHOUT_DEVICE();
  Tensor<float> ks = cuda_ops().upload(Tensor<float>({2, 4}, "kv_state", 0.0f));
  Tensor<float> ss = cuda_ops().upload(Tensor<float>({2, 4}, "score_state", -INFINITY));
  const Tensor<float> kv = kv_rows(3, 4), sc = scores(3, 4, 0);
  EXPECT_THROW(cuda_ops().compress(kv, sc, 0, 1, ks, ss), Error);                // ratio 1
  EXPECT_THROW(cuda_ops().compress(kv_rows(3, 5), scores(3, 5, 0), 0, 2, ks, ss), Error);  // width
  EXPECT_THROW(cuda_ops().compress(kv, scores(2, 4, 0), 0, 2, ks, ss), Error);  // kv vs score rows
}

}  // namespace
}  // namespace dsv41::test
