// tests/cuda/linear_production_test.cc: the PRODUCTION fp8 linear (cuda/linear_fp8_mma.cu, backend
// `cuda`, CudaMode::kProduction) against its derived bound (scenarios/judge/fp8_mma_bound.h).
//   1. The tensor-core model the bound rests on, probed on the device for wgmma m64n8k32 e4m3 (the
//      production kernel's instruction, layout and descriptors) and mma.sync m16n8k32 e4m3 (the
//      first kernel's), each 32-wide dot from a zero accumulator: every product down to
//      2^(E - kFp8MmaKeptBits) next to the largest (E its exponent) is kept, wherever the small
//      product sits in the 32; and |d - p| <= delta on random, mixed-magnitude and cancelling
//      blocks (the measured bits and err/delta are printed).
//   2. The linear (each GEMM kernel: serial, pipelined, pipelined-tma, ws) on released-like shapes
//      (K 5120 and a K not a multiple of the 128-wide stage, T not a multiple of the 128-row
//      tile), random data: every output finite, not all zero,
//      within the bound of its exact value; err/bound, the bound in bf16 ulps and the share of
//      outputs that differ from the exact reference's are printed.
// Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "formats/minifloat.h"
#include "reference/ops/dtype.h"
#include "reference/ops/linear.h"
#include "scenarios/judge/fp8_mma_bound.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using reference::DType;
using reference::LinearWeight;
using scenarios::judge::fp8_mma_block_error;
using scenarios::judge::kFp8MmaKeptBits;

const gpu::CudaOps& production_ops() {
  static const gpu::CudaOps ops(gpu::CudaMode::kProduction);
  return ops;
}

uint8_t code_of(float v) { return static_cast<uint8_t>(formats::E4M3::encode(v)); }

// The two tensor-core paths of the probe: wgmma (the production kernel's) and mma.sync (the first
// kernel's, kept for comparison).
enum class Path { kWgmma, kMmaSync };
const char* path_name(Path p) { return p == Path::kWgmma ? "wgmma m64n8k32" : "mma.sync m16n8k32"; }

// One probe: a [64][32], b [8][32] values (E4M3) -> d [64][8], each dot one instruction from zero.
std::vector<float> probe(Path path, const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<uint8_t> ac(a.size()), bc(b.size());
  for (size_t i = 0; i < a.size(); ++i) ac[i] = code_of(a[i]);
  for (size_t i = 0; i < b.size(); ++i) bc[i] = code_of(b[i]);
  gpu::DeviceBuffer<uint8_t> da(ac.size()), db(bc.size());
  gpu::DeviceBuffer<float> dd(64 * 8);
  da.upload(ac);
  db.upload(bc);
  dd.poison();
  if (path == Path::kWgmma) {
    gpu::fp8_wgmma_probe(da.get(), db.get(), dd.get());
  } else {
    gpu::fp8_mma_sync_probe(da.get(), db.get(), dd.get());
  }
  return dd.download();
}

// Row 0 x column 0: 448 * 1 at k = 0 and 2^j at k = pos (as a * b, both E4M3), zero elsewhere.
float probe_pair(Path path, int j, int pos, float sign = 1.0f) {
  std::vector<float> a(64 * 32, 0.0f), b(8 * 32, 0.0f);
  a[0] = 448.0f;
  b[0] = 1.0f;
  const int ja = std::max(j, -9);  // E4M3's smallest power of two is 2^-9
  a[pos] = sign * std::ldexp(1.0f, ja);
  b[pos] = std::ldexp(1.0f, j - ja);
  return probe(path, a, b)[0];
}

class Fp8TensorCoreModel : public ::testing::TestWithParam<Path> {};

TEST_P(Fp8TensorCoreModel, KeepsEveryBitTheBoundAssumes) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Path path = GetParam();
  const int E = 8;  // 448 = 1.75 * 2^8
  int kept_down_to = E + 1;
  for (int j = E; j >= -18; --j) {
    if (probe_pair(path, j, 1) != 448.0f + std::ldexp(1.0f, j)) break;
    kept_down_to = j;
  }
  std::printf("measured (%s): next to a product of exponent %d, products down to 2^%d are kept (%d bits below the "
              "leading bit); the bound assumes %d\n", path_name(path), E, kept_down_to, E - kept_down_to,
              kFp8MmaKeptBits);
  EXPECT_LE(kept_down_to, E - kFp8MmaKeptBits) << "the device keeps fewer bits than fp8_mma_bound.h assumes";
  for (int pos : {1, 15, 16, 31}) {  // wherever the small product sits among the 32
    const int j = E - kFp8MmaKeptBits;
    EXPECT_EQ(probe_pair(path, j, pos), 448.0f + std::ldexp(1.0f, j)) << "2^" << j << " at k = " << pos;
  }
  if (kept_down_to > -18) {  // the first lost bit: its direction, for the record
    const int j = kept_down_to - 1;
    const float pos = probe_pair(path, j, 1), neg = probe_pair(path, j, 1, -1.0f);
    std::printf("measured (%s): 448 + 2^%d gives %.9g, 448 - 2^%d gives %.9g (%s)\n", path_name(path), j, pos, j, neg,
                neg == 448.0f ? "truncated toward zero"
                : neg == 448.0f - std::ldexp(1.0f, kept_down_to) ? "floored (sign-fill shift)" : "other");
  }
}

// Random E4M3 values of three kinds: uniform codes, one large product among small ones, and
// cancelling halves.
float random_e4m3(std::mt19937_64& g, int lo_code, int hi_code) {
  std::uniform_int_distribution<int> c(lo_code, hi_code), s(0, 1);
  return (s(g) ? -1.0f : 1.0f) * formats::e4m3_decode(static_cast<uint32_t>(c(g)));
}

TEST_P(Fp8TensorCoreModel, BlockErrorsWithinDelta) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Path path = GetParam();
  double worst = 0, worst_rel = 0;
  int64_t differ = 0, blocks = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> a(64 * 32), b(8 * 32);
      for (float& v : a) v = random_e4m3(rng(), 0, kind == 1 ? 0x50 : 0x7E);
      for (float& v : b) v = random_e4m3(rng(), 0, kind == 1 ? 0x50 : 0x7E);
      if (kind == 1) {  // one large product per row / column
        for (int r = 0; r < 64; ++r) a[r * 32 + r % 32] = 448.0f;
        for (int c = 0; c < 8; ++c) b[c * 32 + c] = 448.0f;
      }
      if (kind == 2) {  // the second half cancels the first but for one element
        for (int r = 0; r < 64; ++r)
          for (int k = 0; k < 16; ++k) a[r * 32 + 16 + k] = a[r * 32 + k];
        for (int c = 0; c < 8; ++c)
          for (int k = 0; k < 16; ++k) b[c * 32 + 16 + k] = k == c ? b[c * 32 + k] : -b[c * 32 + k];
      }
      const std::vector<float> d = probe(path, a, b);
      for (int r = 0; r < 64; ++r) {
        for (int c = 0; c < 8; ++c) {
          double p = 0, mag = 0;
          for (int k = 0; k < 32; ++k) {
            p += static_cast<double>(a[r * 32 + k]) * b[c * 32 + k];
            mag += std::fabs(static_cast<double>(a[r * 32 + k]) * b[c * 32 + k]);
          }
          const double delta = fp8_mma_block_error(&a[r * 32], &b[c * 32], 32);
          const double err = std::fabs(static_cast<double>(d[r * 8 + c]) - p);
          ASSERT_TRUE(std::isfinite(d[r * 8 + c])) << "kind " << kind << " row " << r << " col " << c;
          EXPECT_LE(err, delta) << path_name(path) << " kind " << kind << " row " << r << " col " << c << ": d "
                                << d[r * 8 + c] << " exact " << p;
          if (err > 0) {
            ++differ;
            worst = std::max(worst, err / delta);
            worst_rel = std::max(worst_rel, err / mag);
          }
          ++blocks;
        }
      }
    }
  }
  std::printf("measured (%s): %lld of %lld block dots differ from the exact dot; max err/delta %.3g, max err / "
              "sum|products| %.3g\n", path_name(path), static_cast<long long>(differ), static_cast<long long>(blocks),
              worst, worst_rel);
}

// Which emulation of the block dot reproduces the device's bits (the CPU's ref-order:trunc13 and the
// fp8-tensor-core bounds rest on it): products truncated toward zero at 2^(Emax - K), Emax the
// largest product exponent of each group of G products, the group sums exact, then accumulated with
// the running sum truncated toward zero to F bits below its leading bit (F 0: exact), then fp32.
// On checkpoint-like blocks (normal values, each 32 scaled to a max code near 448) and uniform codes;
// the match share of each candidate and the device's mean signed error (toward zero < 0) are printed.
double emulate_block(const float* a, const float* b, int K, int G, int F) {
  double acc = 0;
  for (int g0 = 0; g0 < 32; g0 += G) {
    double pmax = 0;
    for (int i = g0; i < g0 + G; ++i) pmax = std::max(pmax, std::fabs(static_cast<double>(a[i]) * b[i]));
    double sum = 0;
    if (pmax > 0) {
      const double q = std::ldexp(1.0, std::ilogb(pmax) - K);
      for (int i = g0; i < g0 + G; ++i) sum += std::trunc(static_cast<double>(a[i]) * b[i] / q) * q;
    }
    acc += sum;
    if (F > 0 && acc != 0) {
      const double qa = std::ldexp(1.0, std::ilogb(acc) - F);
      acc = std::trunc(acc / qa) * qa;
    }
  }
  return static_cast<float>(acc);
}

TEST(Fp8TensorCoreEmulation, WhichModelMatchesTheDevice) {
  DSV41_SKIP_WITHOUT_DEVICE();
  struct Candidate {
    int K, G, F;
    int64_t match = 0;
  };
  std::vector<Candidate> cands;
  for (int K : {12, 13, 14})
    for (int G : {4, 8, 16, 32})
      for (int F : {0, 12, 13, 14, 15, 23}) cands.push_back({K, G, F});
  int64_t blocks = 0, exact_match = 0;
  double signed_err = 0, mag = 0;
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int kind = 0; kind < 2; ++kind) {
    for (int rep = 0; rep < 24; ++rep) {
      std::vector<float> a(64 * 32), b(8 * 32);
      const auto fill = [&](std::vector<float>& v) {
        for (size_t r0 = 0; r0 < v.size(); r0 += 32) {
          if (kind == 1) {
            for (size_t i = r0; i < r0 + 32; ++i) v[i] = random_e4m3(rng(), 0, 0x7E);
            continue;
          }
          float raw[32], amax = 0;
          for (float& x : raw) amax = std::max(amax, std::fabs(x = n(rng())));
          for (int i = 0; i < 32; ++i) v[r0 + i] = formats::e4m3_decode(formats::e4m3_encode_satfinite(raw[i] * 440.0f / amax));
        }
      };
      fill(a);
      fill(b);
      const std::vector<float> d = probe(Path::kWgmma, a, b);
      for (int r = 0; r < 64; ++r) {
        for (int c = 0; c < 8; ++c) {
          const float* ar = &a[r * 32];
          const float* bc = &b[c * 32];
          double p = 0, m = 0;
          for (int k = 0; k < 32; ++k) {
            p += static_cast<double>(ar[k]) * bc[k];
            m += std::fabs(static_cast<double>(ar[k]) * bc[k]);
          }
          const float dv = d[r * 8 + c];
          ASSERT_TRUE(std::isfinite(dv));
          exact_match += dv == static_cast<float>(p);
          signed_err += (static_cast<double>(dv) - p) * (p < 0 ? -1 : 1);
          mag += std::fabs(p);
          for (Candidate& cd : cands) cd.match += emulate_block(ar, bc, cd.K, cd.G, cd.F) == dv;
          ++blocks;
        }
      }
    }
  }
  std::sort(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) { return x.match > y.match; });
  std::printf("measured (wgmma m64n8k32, %lld blocks): the exact dot rounded to fp32 matches %.4f; mean signed error "
              "toward |p| %.3g of mean |p|\n", static_cast<long long>(blocks),
              static_cast<double>(exact_match) / static_cast<double>(blocks), signed_err / mag);
  for (size_t i = 0; i < 12 && i < cands.size(); ++i) {
    std::printf("  emulation K %d G %d F %d: matches %.4f\n", cands[i].K, cands[i].G, cands[i].F,
                static_cast<double>(cands[i].match) / static_cast<double>(blocks));
  }
  for (const Candidate& cd : cands) {
    if (cd.K == 13 && cd.G == 32 && cd.F == 0) {
      std::printf("  ref-order:trunc13 (K 13 G 32 F 0): matches %.4f\n",
                  static_cast<double>(cd.match) / static_cast<double>(blocks));
    }
  }
  EXPECT_GT(blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Paths, Fp8TensorCoreModel, ::testing::Values(Path::kWgmma, Path::kMmaSync),
                         [](const auto& info) { return std::string(info.param == Path::kWgmma ? "wgmma" : "mma_sync"); });

// A checkpoint-like F8 weight: normal values quantized per 32x32 tile to E4M3 with an E8M0 scale
// (2^ceil(log2(amax / 448))), as the released checkpoint's.
LinearWeight checkpoint_like_weight(int64_t out, int64_t in) {
  LinearWeight w;
  w.name = "test.fp8";
  w.dtype = DType::kF8E4M3;
  w.out = out;
  w.in = in;
  w.w.resize(static_cast<size_t>(out * in));
  const int64_t tr = (out + 31) / 32, tc = in / 32;
  w.scale.resize(static_cast<size_t>(tr * tc));
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> raw(w.w.size());
  for (float& v : raw) v = n(rng());
  for (int64_t bo = 0; bo < tr; ++bo) {
    for (int64_t bk = 0; bk < tc; ++bk) {
      float amax = 0;
      for (int64_t o = bo * 32; o < std::min(out, bo * 32 + 32); ++o)
        for (int64_t k = bk * 32; k < bk * 32 + 32; ++k) amax = std::max(amax, std::fabs(raw[o * in + k]));
      const float s = std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(amax / 448.0f))));
      w.scale[bo * tc + bk] = s;
      for (int64_t o = bo * 32; o < std::min(out, bo * 32 + 32); ++o)
        for (int64_t k = bk * 32; k < bk * 32 + 32; ++k)
          w.w[o * in + k] = formats::e4m3_decode(formats::e4m3_encode_satfinite(raw[o * in + k] / s));
    }
  }
  return w;
}

struct Shape {
  int64_t T, out, in;
};

// Once per GEMM kernel (the DSV41_FP8_LINEAR_KERNEL value; --gtest_filter can pick one).
class ProductionLinearKernels : public ::testing::TestWithParam<const char*> {};

TEST_P(ProductionLinearKernels, WithinTheDerivedBoundOfTheExactValue) {
  DSV41_SKIP_WITHOUT_DEVICE();
  struct KernelEnv {  // DSV41_FP8_LINEAR_KERNEL = kernel for this test, restored after it
    const char* name = "DSV41_FP8_LINEAR_KERNEL";
    const char* was = std::getenv(name);
    std::string old = was != nullptr ? was : "";
    explicit KernelEnv(const char* kernel) { setenv(name, kernel, 1); }
    ~KernelEnv() { was != nullptr ? setenv(name, old.c_str(), 1) : unsetenv(name); }
  };
  const char* kernel = GetParam();
  const KernelEnv env(kernel);
  for (const Shape s : {Shape{1, 256, 512}, Shape{64, 768, 5120}, Shape{200, 1000, 4192}}) {
    const LinearWeight w = checkpoint_like_weight(s.out, s.in);
    reference::Tensor<float> x = random_bf16({s.T, s.in}, 1.0f);
    for (int64_t k = 0; k < std::min<int64_t>(s.in, 64); ++k) {  // blocks of other scales
      x.at(0, k) = formats::round_to_bf16(x.at(0, k) * 1e3f);
    }
    const reference::Tensor<float> got = production_ops().download(production_ops().linear(x, w));
    const reference::Tensor<float> ref = reference::linear(x, w);
    ASSERT_EQ(got.shape(), ref.shape());
    const int64_t nb = s.in / 32, tc = nb;
    std::vector<float> codes(static_cast<size_t>(s.in)), ascale(static_cast<size_t>(nb));
    double worst = 0, ulps_sum = 0, worst_ref_ulps = 0;
    int64_t nonzero = 0, differ_ref = 0, tight = 0;
    std::vector<scenarios::judge::Fp8Block> blocks(static_cast<size_t>(nb));
    for (int64_t t = 0; t < s.T; ++t) {
      reference::act_quant_row(x.row(t), s.in, codes.data(), ascale.data());
      std::vector<double> exact(static_cast<size_t>(s.out)), bound(static_cast<size_t>(s.out));
      double row_max = 0;
      for (int64_t o = 0; o < s.out; ++o) {
        double y = 0;
        for (int64_t b = 0; b < nb; ++b) {
          const float* a = codes.data() + b * 32;
          const float* wv = w.w.data() + o * s.in + b * 32;
          double p = 0;
          for (int i = 0; i < 32; ++i) p += static_cast<double>(a[i]) * wv[i];
          const double sc = static_cast<double>(ascale[b]) * w.scale[(o / 32) * tc + b];
          blocks[b] = {sc, p, fp8_mma_block_error(a, wv, 32)};
          y += sc * p;
        }
        exact[o] = y;
        bound[o] = scenarios::judge::fp8_mma_linear_bound(blocks, y);
        row_max = std::max(row_max, std::fabs(y));
      }
      for (int64_t o = 0; o < s.out; ++o) {
        const float g = got.at(t, o);
        ASSERT_TRUE(std::isfinite(g)) << "T=" << t << " o=" << o;
        nonzero += g != 0.0f;
        // + the double evaluation of the exact value: nb blocks summed in double
        const double slack = 0x1p-50 * static_cast<double>(nb) * std::fabs(exact[o]);
        const double err = std::fabs(static_cast<double>(g) - exact[o]);
        EXPECT_LE(err, bound[o] + slack) << "shape " << s.T << "x" << s.out << "x" << s.in << " t " << t << " o " << o
                                         << ": got " << g << " exact " << exact[o] << " bound " << bound[o];
        worst = std::max(worst, err / bound[o]);
        const double ulp_row = std::ldexp(1.0, std::ilogb(row_max) - 7);
        ulps_sum += bound[o] / ulp_row;
        tight += bound[o] <= 1.5 * ulp_row;
        if (g != ref.at(t, o)) {
          ++differ_ref;
          worst_ref_ulps = std::max(worst_ref_ulps, std::fabs(g - ref.at(t, o)) / ulp_row);
        }
      }
    }
    const double n = static_cast<double>(s.T * s.out);
    EXPECT_GT(nonzero, 0) << "all outputs zero";
    std::printf("%s kernel, shape T %lld, out %lld, in %lld: max err/bound %.3f; bound mean %.3f bf16 ulps of the "
                "row max, %.1f%% of outputs within 1.5 ulps; %.2f%% of outputs differ from the reference's (max %.2f "
                "ulps of the row max)\n",
                kernel, static_cast<long long>(s.T), static_cast<long long>(s.out), static_cast<long long>(s.in), worst,
                ulps_sum / n, 100.0 * tight / n, 100.0 * differ_ref / n, worst_ref_ulps);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ProductionLinearKernels, ::testing::Values("serial", "pipelined", "pipelined-tma", "ws"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n == "pipelined-tma" ? std::string("pipelined_tma") : n;
                         });

TEST(ProductionLinear, RaisesTheReferenceErrorOnANonBf16Input) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const LinearWeight w = checkpoint_like_weight(32, 64);
  reference::Tensor<float> x = random_bf16({2, 64});
  x.at(1, 5) = 1.0f + 1.0f / 1024.0f;  // not a bf16 value
  EXPECT_THROW(production_ops().linear(x, w), Error);
}

TEST(ProductionLinear, OtherWeightDtypesStayExact) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const DType d : {DType::kF4, DType::kBF16, DType::kF32}) {
    const LinearWeight w = random_weight(d, 70, 96);
    const reference::Tensor<float> x = random_bf16({3, 96});
    EXPECT_TRUE(same_bits(reference::linear(x, w), production_ops().linear(x, w))) << reference::dtype_name(d);
  }
  const LinearWeight f8 = random_weight(DType::kF8E4M3, 70, 96);  // linear_fp32 of an F8 weight: exact kernel
  const reference::Tensor<float> x = random_bf16({3, 96});
  EXPECT_TRUE(same_bits(reference::linear_fp32(x, f8), production_ops().linear_fp32(x, f8)));
}

}  // namespace
}  // namespace dsv41::test
