// reference/ops/rmsnorm against the OFFICIAL code's outputs (golden/oracle), bit for bit:
//   - kernels.h5 rmsnorm (4 rows of 256 including an all-zero row);
//   - every RMSNorm of the prefill whose input the oracle lets us rebuild exactly:
//     attn_norm of layer 0 (input = the embedding), of layers 2, 6, 8 (input = the previous
//     layer's stream collapsed with its `pre`), and the final norm (333 x 256 each);
// plus the summation order itself (a known answer where order decides the result, and an
// independently written cascade), thread independence and the error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "golden/golden_io.h"
#include "reference/ops/config.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"
#include "reference/checkpoint/safetensors.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

using golden::Array;
using golden::H5File;

const std::string kOracle = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/";

// Counts outputs whose bf16 bits differ from the oracle, after checking they are meaningful.
int64_t count_differing(const Tensor<float>& got, const std::vector<uint16_t>& want, const char* what) {
  EXPECT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  int64_t differing = 0, nonzero = 0, nan = 0;
  for (size_t i = 0; i < want.size() && i < got.data().size(); ++i) {
    const float v = got.data()[i];
    nan += std::isnan(v);
    nonzero += v != 0.0f;
    differing += formats::bf16_encode(v) != want[i];
  }
  EXPECT_EQ(nan, 0) << what;
  EXPECT_GT(nonzero, got.numel() / 2) << what;
  std::printf("[rmsnorm] %s: %zu outputs, %lld differ (bitwise-equal fraction %.6f)\n", what, want.size(),
              static_cast<long long>(differing), 1.0 - double(differing) / double(want.size()));
  return differing;
}

Tensor<float> bf16_rows(const Array<uint16_t>& a, int64_t rows, int64_t cols, const std::string& name) {
  std::vector<float> v(a.data.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = formats::bf16_decode(a.data[i]);
  return Tensor<float>({rows, cols}, std::move(v), name);
}

TEST(RmsNormOracle, KernelRowsMatchBitwise) {
  H5File f(kOracle + "kernels.h5");
  const Array<uint16_t> x = f.read<uint16_t>("rmsnorm/x/bits", 2);       // [4, 256] bf16, row 2 zero
  const Array<uint16_t> w = f.read<uint16_t>("rmsnorm/weight/bits", 1);  // [256] bf16
  const Array<uint16_t> y = f.read<uint16_t>("rmsnorm/y/bits", 2);       // [4, 256] bf16
  std::vector<float> weight;
  for (uint16_t b : w.data) weight.push_back(formats::bf16_decode(b));
  const double eps = load_config_file(kOracle + "config.json").norm_eps;  // 1e-20
  const Tensor<float> out = rms_norm(bf16_rows(x, x.dim(0), x.dim(1), "x"), weight, eps);
  EXPECT_EQ(count_differing(out, y.data, "kernels.h5 rmsnorm [4,256]"), 0);
  for (int64_t i = 0; i < x.dim(1); ++i) EXPECT_EQ(out.at(2, i), 0.0f) << "zero row stays zero";
}

// The attention input of a layer: hc_pre(stream, pre) = bf16(sum_i pre[i] * X[i]), the 4-term
// sum in fp32 from 0 in copy order (torch's sum over a size-4 non-innermost dimension). A test
// helper to rebuild the norm's input; the mHC component owns the real one.
Tensor<float> collapse_stream(const Array<uint16_t>& stream, const Array<float>& pre) {
  const int64_t T = stream.dim(1), hc = stream.dim(2), dim = stream.dim(3);  // [1, T, hc, dim]
  Tensor<float> y({T, dim}, "hc_pre");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < dim; ++d) {
      float acc = 0.0f;
      for (int64_t i = 0; i < hc; ++i) {
        const float xv = formats::bf16_decode(stream.data[static_cast<size_t>((t * hc + i) * dim + d)]);
        acc += pre.data[static_cast<size_t>(t * hc + i)] * xv;
      }
      y.at(t, d) = formats::round_to_bf16(acc);
    }
  }
  return y;
}

TEST(RmsNormOracle, PrefillNormsMatchBitwise) {
  H5File streams(kOracle + "prefill_streams.h5");
  H5File attn(kOracle + "prefill_attn.h5");
  H5File prefill(kOracle + "prefill.h5");
  const auto weights = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  const double eps = load_config_file(kOracle + "config.json").norm_eps;
  auto norm_weight = [&](const std::string& name) {
    return weights.get(name, DType::kBF16, {256}).to_f32();
  };
  int64_t total = 0, differing = 0;
  {  // layer 0: the stream is 4 copies of the embedding and pre is one-hot, so the input is embed
    const Array<uint16_t> embed = streams.read<uint16_t>("prefill/embed/bits", 3);  // [1, 333, 256]
    const Tensor<float> y = rms_norm(bf16_rows(embed, embed.dim(1), embed.dim(2), "embed"),
                                     norm_weight("layers.0.attn_norm.weight"), eps);
    const Array<uint16_t> want = attn.read<uint16_t>("prefill/layer00/attn_in/bits", 3);
    differing += count_differing(y, want.data, "layer 0 attn_norm (333x256)");
    total += y.numel();
  }
  for (int layer : {2, 6, 8, 10}) {  // 10: the final norm, after layer 9
    char prev[32];
    std::snprintf(prev, sizeof(prev), "layer%02d", (layer - 1) % 100);
    const Array<uint16_t> stream = streams.read<uint16_t>(std::string("prefill/") + prev + "/out_stream/bits", 4);
    const Array<float> pre = prefill.read<float>(std::string("prefill/") + prev + "/next_pre/value", 3);
    const bool final_norm = layer == 10;
    const std::string wname = final_norm ? "norm.weight" : "layers." + std::to_string(layer) + ".attn_norm.weight";
    const Tensor<float> y = rms_norm(collapse_stream(stream, pre), norm_weight(wname), eps);
    char want_name[64];
    std::snprintf(want_name, sizeof(want_name), "prefill/layer%02d/attn_in/bits", layer % 100);
    const Array<uint16_t> want = final_norm ? prefill.read<uint16_t>("prefill/final_norm_out/bits", 3)
                                            : attn.read<uint16_t>(want_name, 3);
    const std::string what = final_norm ? "final norm (333x256)" : "layer " + std::to_string(layer) + " attn_norm (333x256)";
    differing += count_differing(y, want.data, what.c_str());
    total += y.numel();
  }
  std::printf("[rmsnorm] prefill total: %lld outputs, %lld differ\n", static_cast<long long>(total),
              static_cast<long long>(differing));
  EXPECT_EQ(differing, 0);
}

TEST(RmsNormSum, OrderDecidesAKnownAnswer) {
  // n = 9: one 8-lane vector plus a scalar tail. torch: tail first (0 + -1e8), then the lanes
  // left to right: -1e8 + 1e8 = 0, then seven 1s -> 7. A sequential fp32 sum loses the 1s
  // against 1e8 (ulp 8) and gives 0.
  const float x[9] = {1e8f, 1, 1, 1, 1, 1, 1, 1, -1e8f};
  EXPECT_EQ(torch_sum_f32(x, 9), 7.0f);
  float sequential = 0.0f;
  for (float v : x) sequential += v;
  EXPECT_EQ(sequential, 0.0f);
  // n < 8: four scalar chains; chain 0 = x0 + x4, then + x1, + x2, + x3.
  const float y[5] = {1e8f, 1, 1, 1, -1e8f};
  EXPECT_EQ(torch_sum_f32(y, 5), 3.0f);  // ((1e8 - 1e8) + 1) + 1 + 1
}

// An independently written model of torch's cascade (SumKernel.cpp), structured as in the
// Python/Rust ports: explicit level counters, levels folded upward at the end.
float cascade_model(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t W = n < 8 ? 1 : 8;
  const int64_t vecs = n / W, rows = vecs / 4;
  int64_t ceil_log2 = 0;
  while ((int64_t{1} << ceil_log2) < rows) ++ceil_log2;
  const int64_t power = std::max<int64_t>(4, ceil_log2 / 4), step = int64_t{1} << power;
  std::vector<float> acc(4 * 4 * W, 0.0f);  // [level][chain][lane]
  auto A = [&](int64_t level, int64_t chain, int64_t lane) -> float& { return acc[(level * 4 + chain) * W + lane]; };
  int64_t i = 0;
  while (i + step <= rows) {
    for (int64_t s = 0; s < step; ++s, ++i) {
      for (int64_t c = 0; c < 4; ++c) {
        for (int64_t l = 0; l < W; ++l) A(0, c, l) += x[static_cast<size_t>((i * 4 + c) * W + l)];
      }
    }
    for (int64_t level = 1; level < 4; ++level) {
      for (int64_t c = 0; c < 4; ++c) {
        for (int64_t l = 0; l < W; ++l) {
          A(level, c, l) += A(level - 1, c, l);
          A(level - 1, c, l) = 0.0f;
        }
      }
      if (i % (int64_t{1} << (power * (level + 1))) != 0) break;  // level counter not wrapped
    }
  }
  for (; i < rows; ++i) {
    for (int64_t c = 0; c < 4; ++c) {
      for (int64_t l = 0; l < W; ++l) A(0, c, l) += x[static_cast<size_t>((i * 4 + c) * W + l)];
    }
  }
  for (int64_t level = 1; level < 4; ++level) {
    for (int64_t c = 0; c < 4; ++c) {
      for (int64_t l = 0; l < W; ++l) A(level, c, l) += A(level - 1, c, l);
    }
  }
  std::vector<float> chain0(static_cast<size_t>(W));
  for (int64_t l = 0; l < W; ++l) chain0[l] = A(3, 0, l);
  for (int64_t v = rows * 4; v < vecs; ++v) {
    for (int64_t l = 0; l < W; ++l) chain0[l] += x[static_cast<size_t>(v * W + l)];
  }
  for (int64_t c = 1; c < 4; ++c) {
    for (int64_t l = 0; l < W; ++l) chain0[l] += A(3, c, l);
  }
  if (W == 1) return chain0[0];
  float sum = 0.0f;
  for (int64_t k = vecs * W; k < n; ++k) sum += x[static_cast<size_t>(k)];
  for (int64_t l = 0; l < W; ++l) sum += chain0[l];
  return sum;
}

TEST(RmsNormSum, MatchesAnIndependentModelOfTheCascade) {
  // Sizes cover: scalar path (< 8), no cascade (< 512), one and several cascade levels
  // (4096: 2^7 rows of 4 vectors; 16384 = hc * dim of the released model; 20001 with tails).
  const int64_t sizes[] = {1, 3, 7, 8, 9, 31, 33, 255, 256, 257, 511, 512, 513, 2048, 4096, 4103, 16384, 20001};
  std::mt19937_64 rng(test::seed_for("rmsnorm/cascade"));
  std::lognormal_distribution<float> mag(0.0f, 3.0f);
  std::bernoulli_distribution neg(0.5);
  int64_t order_matters = 0;
  for (int64_t n : sizes) {
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = neg(rng) ? -mag(rng) : mag(rng);
      const float got = torch_sum_f32(x.data(), n);
      ASSERT_FALSE(std::isnan(got));
      ASSERT_EQ(dsv41::f32_bits(got), dsv41::f32_bits(cascade_model(x))) << "n=" << n << " trial " << trial;
      float sequential = 0.0f;
      for (float v : x) sequential += v;
      order_matters += sequential != got;
    }
  }
  EXPECT_GT(order_matters, 0) << "the cascade order never differed from a sequential sum";
}

TEST(RmsNorm, RowsAreIndependentOfThreadsAndLeadingShape) {
  std::mt19937_64 rng(test::seed_for("rmsnorm/rows/[3,5,72]"));  // 72: a vector tail of 0 lanes, 2 vectors left over
  std::normal_distribution<float> normal(0.0f, 2.0f);
  Tensor<float> x({3, 5, 72}, "x");
  for (float& v : x.data()) v = formats::round_to_bf16(normal(rng));
  std::vector<float> w(72);
  for (float& v : w) v = formats::round_to_bf16(normal(rng));
  set_reference_threads(1);
  const Tensor<float> one = rms_norm(x, w, 1e-20);
  set_reference_threads(4);
  const Tensor<float> four = rms_norm(x, w, 1e-20);
  set_reference_threads(0);
  int64_t nonzero = 0;
  for (int64_t r = 0; r < 15; ++r) {
    std::vector<float> y(72);
    rms_norm_row(x.data().data() + r * 72, w.data(), 72, 1e-20, y.data());
    for (int64_t i = 0; i < 72; ++i) {
      const size_t k = static_cast<size_t>(r * 72 + i);
      nonzero += y[i] != 0.0f;
      ASSERT_EQ(dsv41::f32_bits(one.data()[k]), dsv41::f32_bits(y[i]));
      ASSERT_EQ(dsv41::f32_bits(four.data()[k]), dsv41::f32_bits(y[i]));
      ASSERT_EQ(formats::round_to_bf16(y[i]), y[i]) << "outputs are bf16 values";
    }
  }
  EXPECT_GT(nonzero, 15 * 72 / 2);
}

TEST(RmsNorm, RejectsBadShapes) {
  EXPECT_THROW(rms_norm(Tensor<float>({2, 8}, "x"), std::vector<float>(7, 1.0f), 1e-20), Error);
  EXPECT_THROW(rms_rsqrt_f32(nullptr, 0, 1e-20), Error);
  std::vector<float> big(32768, 1.0f);
  EXPECT_THROW(torch_sum_f32(big.data(), 32768), Error);
}

}  // namespace
}  // namespace dsv41::reference
