// reference/ops/linear against the OFFICIAL code's outputs (golden/oracle, oracle README §4):
//   - act_quant (block 32, ue8m0) of the gemm input and of all 10 adversarial quant sets: bit-exact;
//   - model.linear with fp8 weights (gemm/fp8) and fp4 weights (gemm/fp4): every output bit-exact
//     (the documented budget is 1 bf16 ulp, kernel_cpu.py's own claim for a tensor-core order);
//   - bf16 F.linear inside the prefill (layer 6's ratio-1 compressor: norm(wkv(attn_in)) =
//     compressor_latent), within a declared budget;
// plus loading, exactness properties, thread-count independence and error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "golden/golden_io.h"
#include "reference/ops/config.h"
#include "reference/ops/linear.h"
#include "reference/checkpoint/weights.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"
#include "reference/checkpoint/safetensors.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

using golden::Array;
using golden::H5File;

const std::string kOracle = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/";

float bf16_value(uint16_t bits) { return formats::bf16_decode(bits); }
uint16_t bf16_bits(float v) { return formats::bf16_encode(v); }

// Distance in bf16 ulps between two finite bf16 bit patterns (sign-magnitude -> ordered ints).
int64_t bf16_ulps(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t v) -> int64_t { return (v & 0x8000) ? -int64_t(v & 0x7FFF) : int64_t(v); };
  return std::llabs(ordered(a) - ordered(b));
}

Tensor<float> bf16_tensor(const Array<uint16_t>& a, std::vector<int64_t> shape, const std::string& name) {
  std::vector<float> v(a.data.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_value(a.data[i]);
  return Tensor<float>(std::move(shape), std::move(v), name);
}

struct Comparison {
  int64_t count = 0, differing = 0, max_ulps = 0, nonzero = 0, nan = 0;
};

// Compares bf16 outputs with oracle bf16 bits; prints the numbers the report quotes.
Comparison compare_bf16(const Tensor<float>& got, const std::vector<uint16_t>& want, const char* what) {
  Comparison c;
  EXPECT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  for (size_t i = 0; i < want.size() && i < got.data().size(); ++i) {
    const uint16_t g = bf16_bits(got.data()[i]);
    ++c.count;
    if (std::isnan(got.data()[i])) ++c.nan;
    if ((g & 0x7FFF) != 0) ++c.nonzero;
    if (g != want[i]) {
      ++c.differing;
      c.max_ulps = std::max(c.max_ulps, bf16_ulps(g, want[i]));
    }
  }
  std::printf("[linear] %s: %lld outputs, %lld bitwise equal (%.6f), %lld differ, max %lld bf16 ulp\n",
              what, static_cast<long long>(c.count), static_cast<long long>(c.count - c.differing),
              c.count ? double(c.count - c.differing) / double(c.count) : 0.0,
              static_cast<long long>(c.differing), static_cast<long long>(c.max_ulps));
  return c;
}

// The documented GEMM budget (kernel_cpu.py: fp8/fp4 GEMMs agree with the kernel "to at most 1
// bf16 ulp"; the reference's exact in-block dot can differ from torch's fp32 in-block matmul only
// where the latter rounded). Observed on the oracle: 0 differing outputs, asserted below too.
constexpr int64_t kGemmMaxUlps = 1;

TEST(LinearOracle, ActQuantMatchesOracleGemmInput) {
  H5File f(kOracle + "kernels.h5");
  const Array<uint16_t> x = f.read<uint16_t>("gemm/fp8/x/bits", 2);      // [5, 256] bf16
  const Array<uint8_t> xq = f.read<uint8_t>("gemm/fp8/x_q/bits", 2);     // [5, 256] e4m3
  const Array<uint8_t> xs = f.read<uint8_t>("gemm/fp8/x_scale/bits", 2); // [5, 8] e8m0
  const int64_t T = x.dim(0), in = x.dim(1);
  int64_t nonzero = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(static_cast<size_t>(in)), q(row.size()), s(static_cast<size_t>(in / 32));
    for (int64_t i = 0; i < in; ++i) row[i] = bf16_value(x.at(t, i));
    act_quant_row(row.data(), in, q.data(), s.data());
    for (int64_t i = 0; i < in; ++i) {
      ASSERT_FALSE(std::isnan(q[i]));
      nonzero += q[i] != 0.0f;
      ASSERT_EQ(dsv41::f32_bits(q[i]), dsv41::f32_bits(formats::e4m3_decode(xq.at(t, i))))
          << "row " << t << " element " << i;
    }
    for (int64_t b = 0; b < in / 32; ++b) {
      ASSERT_EQ(dsv41::f32_bits(s[b]), dsv41::f32_bits(formats::e8m0_decode(xs.at(t, b))))
          << "row " << t << " block " << b;
    }
  }
  EXPECT_GT(nonzero, T * in / 2);
}

TEST(LinearOracle, ActQuantMatchesOracleAdversarialSets) {
  H5File f(kOracle + "kernels.h5");
  int64_t blocks = 0, skipped = 0, nonzero = 0;
  for (const std::string& set : f.children("quant")) {
    if (set == "FP4_TABLE") continue;
    const std::string g = "quant/" + set + "/";
    const Array<uint16_t> in = f.read<uint16_t>(g + "input/bits", 2);     // [rows, width] bf16
    const Array<uint8_t> q = f.read<uint8_t>(g + "fp8_q/bits", 2);        // [rows, width] e4m3
    const Array<uint8_t> sc = f.read<uint8_t>(g + "fp8_scale/bits", 2);   // [rows, width/32] e8m0
    for (int64_t r = 0; r < in.dim(0); ++r) {
      for (int64_t b = 0; b < in.dim(1) / 32; ++b) {
        float x[32], v[32], s = 0.0f;
        bool finite = true;
        for (int i = 0; i < 32; ++i) {
          x[i] = bf16_value(in.at(r, b * 32 + i));
          finite = finite && std::isfinite(x[i]);
        }
        if (!finite) {  // the official result is undefined there; the reference throws
          EXPECT_THROW(act_quant_row(x, 32, v, &s), Error) << set << " row " << r;
          ++skipped;
          continue;
        }
        act_quant_row(x, 32, v, &s);
        ++blocks;
        ASSERT_EQ(dsv41::f32_bits(s), dsv41::f32_bits(formats::e8m0_decode(sc.at(r, b))))
            << set << " row " << r << " block " << b;
        for (int i = 0; i < 32; ++i) {
          nonzero += v[i] != 0.0f;
          ASSERT_EQ(dsv41::f32_bits(v[i]), dsv41::f32_bits(formats::e4m3_decode(q.at(r, b * 32 + i))))
              << set << " row " << r << " element " << b * 32 + i;
        }
      }
    }
  }
  std::printf("[linear] act_quant: %lld finite blocks bit-exact, %lld non-finite blocks rejected\n",
              static_cast<long long>(blocks), static_cast<long long>(skipped));
  EXPECT_GT(blocks, 10000);
  EXPECT_GT(nonzero, blocks * 8);
}

TEST(LinearOracle, Fp8GemmMatchesOracle) {
  H5File f(kOracle + "kernels.h5");
  const Array<uint16_t> x = f.read<uint16_t>("gemm/fp8/x/bits", 2);       // [5, 256] bf16
  const Array<uint8_t> w = f.read<uint8_t>("gemm/fp8/w/bits", 2);         // [80, 256] e4m3
  const Array<uint8_t> ws = f.read<uint8_t>("gemm/fp8/w_scale/bits", 2);  // [3, 8] e8m0 (32x32 tiles)
  const Array<uint16_t> y = f.read<uint16_t>("gemm/fp8/y/bits", 2);       // [5, 80] bf16
  LinearWeight lw;
  lw.name = "gemm/fp8";
  lw.dtype = DType::kF8E4M3;
  lw.out = w.dim(0);
  lw.in = w.dim(1);
  for (uint8_t b : w.data) lw.w.push_back(formats::e4m3_decode(b));
  for (uint8_t b : ws.data) lw.scale.push_back(formats::e8m0_decode(b));
  const Tensor<float> out = linear(bf16_tensor(x, {x.dim(0), x.dim(1)}, "x"), lw);
  const Comparison c = compare_bf16(out, y.data, "gemm/fp8 [5,256]x[80,256]^T");
  EXPECT_EQ(c.nan, 0);
  EXPECT_GT(c.nonzero, c.count * 9 / 10);
  EXPECT_LE(c.max_ulps, kGemmMaxUlps);
  EXPECT_EQ(c.differing, 0) << "observed bit-exact on the oracle";
}

TEST(LinearOracle, Fp4GemmMatchesOracle) {
  H5File f(kOracle + "kernels.h5");
  const Array<uint16_t> x = f.read<uint16_t>("gemm/fp4/x/bits", 2);       // [5, 256] bf16
  const Array<uint8_t> packed = f.read<uint8_t>("gemm/fp4/w/bits", 2);    // [64, 128] e2m1 x2
  const Array<uint8_t> codes = f.read<uint8_t>("gemm/fp4/w/codes", 2);    // [64, 256] e2m1 codes
  const Array<uint8_t> ws = f.read<uint8_t>("gemm/fp4/w_scale/bits", 2);  // [64, 8] e8m0
  const Array<uint16_t> y = f.read<uint16_t>("gemm/fp4/y/bits", 2);       // [5, 64] bf16
  // The checkpoint reader's F4 decoding (low nibble = even element) gives the oracle's codes.
  checkpoint::safetensors::Entry t;
  t.name = "gemm/fp4/w";
  t.dtype = DType::kF4;
  t.shape = {codes.dim(0), codes.dim(1)};
  t.bytes = packed.data;
  const std::vector<float> unpacked = t.to_f32();
  ASSERT_EQ(unpacked.size(), codes.data.size());
  for (size_t i = 0; i < unpacked.size(); ++i) {
    ASSERT_EQ(dsv41::f32_bits(unpacked[i]), dsv41::f32_bits(formats::e2m1_decode(codes.data[i]))) << i;
  }
  LinearWeight lw;
  lw.name = "gemm/fp4";
  lw.dtype = DType::kF4;
  lw.out = codes.dim(0);
  lw.in = codes.dim(1);
  lw.w = unpacked;
  for (uint8_t b : ws.data) lw.scale.push_back(formats::e8m0_decode(b));
  const Tensor<float> out = linear(bf16_tensor(x, {x.dim(0), x.dim(1)}, "x"), lw);
  const Comparison c = compare_bf16(out, y.data, "gemm/fp4 [5,256]x[64,256]^T");
  EXPECT_EQ(c.nan, 0);
  EXPECT_GT(c.nonzero, c.count * 9 / 10);
  EXPECT_LE(c.max_ulps, kGemmMaxUlps);
  EXPECT_EQ(c.differing, 0) << "observed bit-exact on the oracle";
}

// Budget for a bf16 F.linear followed by RMSNorm, against torch (prefill, layer 6 compressor).
// torch's CPU bf16 GEMM accumulates in fp32 in its own blocked order; the reference sums in
// double. The two fp32 sums differ by a few fp32 ulps (~2^-20 relative for K = 256), which flips
// a bf16 rounding only when the sum lies that close to a bf16 midpoint: expected for ~2^-12 of
// the outputs, each by 1 ulp, and RMSNorm passes such a flip on as at most 1 ulp. Observed: 2 of
// 42624 (0.005%). Budget: 1 ulp, at most 0.1% of the outputs (4x the estimate).
constexpr int64_t kBf16GemmNormMaxUlps = 1;
constexpr double kBf16GemmNormMaxDifferingFraction = 1e-3;

TEST(LinearOracle, Bf16LinearThenNormMatchesCompressorLatentWithinBudget) {
  H5File attn(kOracle + "prefill_attn.h5");
  H5File prefill(kOracle + "prefill.h5");
  const auto weights = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  const Array<uint16_t> x = attn.read<uint16_t>("prefill/layer06/attn_in/bits", 3);  // [1, 333, 256]
  const Array<uint16_t> want = prefill.read<uint16_t>("prefill/layer06/compressor_latent/bits", 3);
  const LinearWeight wkv = checkpoint::load_linear(weights, "layers.6.attn.compressor.wkv", DType::kBF16, 128, 256);
  const std::vector<float> norm =
      weights.get("layers.6.attn.compressor.norm.weight", DType::kBF16, {128}).to_f32();
  const Tensor<float> latent =
      rms_norm(linear(bf16_tensor(x, {x.dim(1), x.dim(2)}, "attn_in"), wkv), norm,
               load_config_file(kOracle + "config.json").norm_eps);
  const Comparison c = compare_bf16(latent, want.data, "layer 6 norm(bf16 wkv(attn_in)) vs compressor_latent");
  EXPECT_EQ(c.nan, 0);
  EXPECT_GT(c.nonzero, c.count * 9 / 10);
  EXPECT_LE(c.max_ulps, kBf16GemmNormMaxUlps);
  EXPECT_LE(double(c.differing), kBf16GemmNormMaxDifferingFraction * double(c.count));
}

TEST(LinearLoad, ReadsEveryWeightDtypeWithOfficialShapes) {
  const auto file = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  struct Case {
    const char* prefix;
    DType dtype;
    int64_t out, in, scales;
  };
  const Case cases[] = {
      {"layers.2.attn.wq_a", DType::kF8E4M3, 128, 256, 4 * 8},      // fp8: 32x32 tiles
      {"layers.0.ffn.experts.0.w2", DType::kF4, 256, 128, 256 * 4},  // fp4: per (row, 32 of K)
      {"layers.0.attn.wo_a", DType::kBF16, 128, 256, 0},            // convert.py's bf16 wo_a
      {"layers.2.attn.compressor.wkv", DType::kF32, 128, 256, 0},    // ratio-2 compressor
  };
  for (const Case& c : cases) {
    const LinearWeight w = checkpoint::load_linear(file, c.prefix, c.dtype, c.out, c.in);
    EXPECT_EQ(w.name, c.prefix);
    EXPECT_EQ(static_cast<int64_t>(w.w.size()), c.out * c.in) << c.prefix;
    EXPECT_EQ(static_cast<int64_t>(w.scale.size()), c.scales) << c.prefix;
    int64_t nonzero = 0;
    for (float v : w.w) nonzero += v != 0.0f && std::isfinite(v);
    EXPECT_GT(nonzero, c.out * c.in / 2) << c.prefix;
    for (float s : w.scale) EXPECT_TRUE(s > 0.0f && std::isfinite(s)) << c.prefix;
  }
}

TEST(LinearLoad, RejectsWrongDtypeOrShapeNamingTheTensor) {
  const auto file = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  try {
    checkpoint::load_linear(file, "layers.2.attn.wq_a", DType::kBF16, 128, 256);
    FAIL() << "wrong dtype accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2.attn.wq_a.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checkpoint::load_linear(file, "layers.2.attn.wq_a", DType::kF8E4M3, 256, 128), Error);
  EXPECT_THROW(checkpoint::load_linear(file, "layers.2.attn.missing", DType::kF8E4M3, 128, 256), Error);
  EXPECT_THROW(checkpoint::load_linear(file, "layers.2.attn.wq_a", DType::kF8E8M0, 128, 256), Error);
}

// Seeded random weights of each dtype (values drawn from the dtype's own code set).
LinearWeight random_weight(DType dtype, int64_t out, int64_t in, std::mt19937_64& rng) {
  LinearWeight w;
  w.name = std::string("random.") + dtype_name(dtype);
  w.dtype = dtype;
  w.out = out;
  w.in = in;
  std::uniform_int_distribution<int> byte(0, 255), e8(120, 130);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (int64_t i = 0; i < out * in; ++i) {
    switch (dtype) {
      case DType::kF8E4M3: {
        int b = byte(rng);
        if ((b & 0x7F) == 0x7F) b ^= 1;  // no NaN code
        w.w.push_back(formats::e4m3_decode(static_cast<uint32_t>(b)));
        break;
      }
      case DType::kF4: w.w.push_back(formats::e2m1_decode(static_cast<uint32_t>(byte(rng) & 15))); break;
      case DType::kBF16: w.w.push_back(formats::round_to_bf16(normal(rng))); break;
      default: w.w.push_back(normal(rng)); break;
    }
  }
  const int64_t scales = dtype == DType::kF8E4M3 ? ((out + 31) / 32) * (in / 32)
                         : dtype == DType::kF4   ? out * (in / 32)
                                                 : 0;
  for (int64_t i = 0; i < scales; ++i) w.scale.push_back(formats::e8m0_decode(static_cast<uint32_t>(e8(rng))));
  return w;
}

Tensor<float> random_bf16(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor<float> x({rows, cols}, "x");
  for (float& v : x.data()) v = formats::round_to_bf16(normal(rng));
  return x;
}

TEST(Linear, ResultDoesNotDependOnThreadCount) {
  // out = 137 (odd: a partial 32-row scale tile and a partial 64-output work item), in = 96.
  std::mt19937_64 rng(test::seed_for("linear/threads/out=137,in=96,T=7"));
  const Tensor<float> x = random_bf16(7, 96, rng);
  for (DType d : {DType::kF8E4M3, DType::kF4, DType::kBF16, DType::kF32}) {
    const LinearWeight w = random_weight(d, 137, 96, rng);
    set_reference_threads(1);
    const Tensor<float> one = linear(x, w);
    set_reference_threads(5);
    const Tensor<float> five = linear(x, w);
    set_reference_threads(0);
    int64_t nonzero = 0;
    for (float v : one.data()) nonzero += v != 0.0f && !std::isnan(v);
    EXPECT_GT(nonzero, one.numel() / 2) << dtype_name(d);
    for (int64_t i = 0; i < one.numel(); ++i) {
      ASSERT_EQ(dsv41::f32_bits(one.data()[i]), dsv41::f32_bits(five.data()[i]))
          << dtype_name(d) << " element " << i;
    }
  }
}

TEST(Linear, OneHotInputSelectsTheScaledWeightColumn) {
  // x = e_j: act_quant gives code 1.0 * 2^-8 (amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8, code 256),
  // so every product is exact and y[o] = bf16(w[o, j] * ws) for fp8/fp4, bf16(w[o, j]) for bf16.
  std::mt19937_64 rng(test::seed_for("linear/onehot/out=40,in=64"));
  for (DType d : {DType::kF8E4M3, DType::kF4, DType::kBF16, DType::kF32}) {
    const LinearWeight w = random_weight(d, 40, 64, rng);
    for (int64_t j : {0, 31, 32, 63}) {
      Tensor<float> x({1, 64}, "onehot");
      x.at(0, j) = 1.0f;
      const Tensor<float> y = linear(x, w);
      for (int64_t o = 0; o < 40; ++o) {
        float want = w.w[static_cast<size_t>(o * 64 + j)];
        if (d == DType::kF8E4M3) want *= w.scale[static_cast<size_t>((o / 32) * 2 + j / 32)];
        if (d == DType::kF4) want *= w.scale[static_cast<size_t>(o * 2 + j / 32)];
        want = 0.0f + want;  // every accumulation starts from +0: a -0 product sums to +0
        if (d != DType::kF32) want = formats::round_to_bf16(want);
        ASSERT_EQ(dsv41::f32_bits(y.at(0, o)), dsv41::f32_bits(want))
            << dtype_name(d) << " o=" << o << " j=" << j;
      }
    }
  }
}

TEST(Linear, Fp32PathIsTheUnroundedProduct) {
  // linear_fp32 on a bf16 weight is the fp32 value that linear() rounds to bf16.
  std::mt19937_64 rng(test::seed_for("linear/fp32/out=33,in=64,T=3"));
  const Tensor<float> x = random_bf16(3, 64, rng);
  const LinearWeight w = random_weight(DType::kBF16, 33, 64, rng);
  const Tensor<float> wide = linear_fp32(x, w), narrow = linear(x, w);
  int64_t inexact = 0;
  for (int64_t i = 0; i < wide.numel(); ++i) {
    ASSERT_FALSE(std::isnan(wide.data()[i]));
    ASSERT_EQ(dsv41::f32_bits(narrow.data()[i]), dsv41::f32_bits(formats::round_to_bf16(wide.data()[i])));
    inexact += formats::round_to_bf16(wide.data()[i]) != wide.data()[i];
  }
  EXPECT_GT(inexact, wide.numel() / 2);  // the fp32 path really is wider than bf16
}

TEST(Linear, RejectsBadInputsWithContext) {
  std::mt19937_64 rng(test::seed_for("linear/errors/out=8,in=32"));
  const LinearWeight w8 = random_weight(DType::kF8E4M3, 8, 32, rng);
  Tensor<float> x({2, 32}, "x", 0.5f);
  x.at(1, 3) = 1.0f + 1.0f / 1024.0f;  // not a bf16 value
  try {
    linear(x, w8);
    FAIL() << "non-bf16 input accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 3]"), std::string::npos) << e.what();
  }
  x.at(1, 3) = NAN;  // a non-finite act_quant block
  try {
    linear(x, w8);
    FAIL() << "NaN block accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(linear(Tensor<float>({2, 31}, "x"), w8), Error);  // in mismatch
  LinearWeight bad = w8;
  bad.scale.pop_back();
  EXPECT_THROW(linear(Tensor<float>({1, 32}, "x"), bad), Error);  // scale count
}

}  // namespace
}  // namespace dsv41::reference
