// tests/cuda/sparse_attn_production_test.cc: the PRODUCTION sparse attention (cuda/attention_wgmma.cu,
// backend `cuda`, CudaMode::kProduction; and the mma.sync variant cuda/attention_mma.cu) against its derived bound
// (scenarios/judge/sparse_attn_mma_bound.h).
//   1. The model the bound rests on, probed on the device for both tensor-core paths (wgmma
//      m64n32k16 in the production kernel's layout, mma.sync m16n8k16): one step keeps every
//      term down to 2^(E - 23) next to the largest (E its exponent), products and accumulator, and
//      |d - exact| <= delta = 2^-18 (|c| + sum |a b|) on random, mixed-magnitude and cancelling
//      steps; the kernel's exp2f within 2 ulp (relative 4u) on a sweep of arguments.
//   2. CudaOps::sparse_attn in kProduction on decode- and prefill-like shapes (64 heads, d 512,
//      128 window rows of FP8-QDQ values + FP4 compressed entries read from the packed cache, -1
//      entries, a sink), the tiny config's shape (4 heads, d 128), heads over one tile, rows of only
//      -1, sharp softmaxes (large q); and the variants directly (mma.sync, wgmma with P in shared
//      memory): every output finite, not all zero, |cuda - exact| <= bound
//      (the kernel's) and |cuda - reference| <= bound + the reference's own bound; printed: max
//      err/bound, the bound in bf16 ulps of the row's largest |exact|, the share of outputs that
//      differ from the reference's.
//   3. The wgmma kernel's coalesced gather (the default) against session 15's row gather
//      (AttnWgmmaVariant::kRowGather): both fill the same tiles, so the outputs must be the same
//      bits (fp32 and bf16 outputs; d 512, 256, 128; two head tiles; K not a multiple of 64; -1s).
//   3b. The split (flash-decoding) kernel: within the split bound (slices of 1, 2, 3 blocks; through
//      CudaOps with DSV41_CUDA_ATTN_SPLIT=1 on decode shapes, and directly); one slice gives the
//      unsplit kernel's bits.
//   4. DSV41_CUDA_PRODUCTION_OPS: with only `linear`, sparse_attn is the exact kernel (the
//      reference's bits); an unknown name is refused.
// Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/attention_split.h"
#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "reference/ops/attention.h"
#include "reference/ops/kv_quant.h"
#include "scenarios/judge/sparse_attn_mma_bound.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using formats::CacheFormat;
using scenarios::judge::AttnArith;
using scenarios::judge::kBf16MmaStepRel;

const gpu::CudaOps& production_ops() {
  static const gpu::CudaOps ops(gpu::CudaMode::kProduction);
  return ops;
}

uint16_t bf16_bits(float v) { return static_cast<uint16_t>(bits(formats::round_to_bf16(v)) >> 16); }

// The two tensor-core paths: mma.sync m16n8k16 (cuda/attention_mma.cu) and wgmma m64n32k16
// (cuda/attention_wgmma.cu, the production path's layout and descriptors).
enum class Path { kMmaSync, kWgmma };
const char* path_name(Path p) { return p == Path::kMmaSync ? "mma.sync m16n8k16 bf16" : "wgmma m64n32k16 bf16"; }
int rows_of(Path p) { return p == Path::kMmaSync ? 16 : 64; }
int cols_of(Path p) { return p == Path::kMmaSync ? 8 : 32; }

// One step: a [M][16], b [N][16] (k contiguous), c [M][N] -> d [M][N] = c + a b^T.
std::vector<float> mma_step(Path path, const std::vector<float>& a, const std::vector<float>& b,
                            const std::vector<float>& c) {
  std::vector<uint16_t> ab(a.size()), bb(b.size());
  for (size_t i = 0; i < a.size(); ++i) ab[i] = bf16_bits(a[i]);
  for (size_t i = 0; i < b.size(); ++i) bb[i] = bf16_bits(b[i]);
  gpu::DeviceBuffer<uint16_t> da(ab.size()), db(bb.size());
  gpu::DeviceBuffer<float> dc(c.size()), dd(c.size());
  da.upload(ab);
  db.upload(bb);
  dc.upload(c);
  dd.poison();
  if (path == Path::kMmaSync) gpu::bf16_mma_probe(da.get(), db.get(), dc.get(), dd.get());
  else gpu::bf16_wgmma_probe(da.get(), db.get(), dc.get(), dd.get());
  return dd.download();
}

// d[0][0] for: product 1 at k = 0 and sign * 2^-j at k = pos (accumulator 0), or accumulator 1 and
// the product sign * 2^-j alone (pos < 0).
float probe_pair(Path path, int j, int pos, float sign = 1.0f) {
  const int M = rows_of(path), N = cols_of(path);
  std::vector<float> a(M * 16, 0.0f), b(N * 16, 0.0f), c(M * N, 0.0f);
  const float small = sign * std::ldexp(1.0f, -j);
  if (pos >= 0) {
    a[0] = 1.0f;
    b[0] = 1.0f;
    a[pos] = small;
    b[pos] = 1.0f;
  } else {
    c[0] = 1.0f;
    a[3] = small;
    b[3] = 1.0f;
  }
  return mma_step(path, a, b, c)[0];
}

class Bf16MmaModel : public ::testing::TestWithParam<Path> {};

TEST_P(Bf16MmaModel, KeepsEveryBitTheBoundAssumes) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Path path = GetParam();
  for (const int pos : {1, 7, 8, 15, -1}) {
    int kept = 0;
    for (int j = 1; j <= 23; ++j) {
      if (probe_pair(path, j, pos) != 1.0f + std::ldexp(1.0f, -j)) break;
      kept = j;
    }
    std::printf("measured (%s): %s at k %d, terms down to 2^-%d kept next to 1; 1 - 2^-24 gives %.9g\n",
                path_name(path), pos < 0 ? "accumulator 1 + product" : "product 1 + product", pos, kept,
                probe_pair(path, 24, pos, -1.0f));
    EXPECT_GE(kept, 23) << "the device keeps fewer bits than sparse_attn_mma_bound.h assumes (pos " << pos << ")";
  }
}

TEST_P(Bf16MmaModel, StepErrorsWithinDelta) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Path path = GetParam();
  const int M = rows_of(path), N = cols_of(path);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 20);
  double worst = 0;
  int64_t differ = 0, steps = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (int rep = 0; rep < (path == Path::kMmaSync ? 40 : 4); ++rep) {
      std::vector<float> a(M * 16), b(N * 16), c(M * N);
      for (float& v : a) v = formats::round_to_bf16(kind == 1 ? std::ldexp(n(rng()), ex(rng())) : n(rng()));
      for (float& v : b) v = formats::round_to_bf16(n(rng()));
      for (int r = 0; r < M; ++r) {
        for (int col = 0; col < N; ++col) {
          double p = 0;
          for (int k = 0; k < 16; ++k) p += static_cast<double>(a[r * 16 + k]) * b[col * 16 + k];
          // kind 2: the accumulator cancels the products but for a little
          c[r * N + col] = kind == 2 ? static_cast<float>(-p * (1 + 1e-3 * n(rng()))) : 8.0f * n(rng());
        }
      }
      const std::vector<float> d = mma_step(path, a, b, c);
      for (int r = 0; r < M; ++r) {
        for (int col = 0; col < N; ++col) {
          double exact = c[r * N + col], prod = 0;
          for (int k = 0; k < 16; ++k) {
            const double p = static_cast<double>(a[r * 16 + k]) * b[col * 16 + k];
            exact += p;
            prod += std::fabs(p);
          }
          const double delta = scenarios::judge::bf16_mma_step_error(std::fabs(c[r * N + col]), prod);
          const double err = std::fabs(static_cast<double>(d[r * N + col]) - exact);
          ASSERT_TRUE(std::isfinite(d[r * N + col]));
          EXPECT_LE(err, delta) << path_name(path) << " kind " << kind << " row " << r << " col " << col;
          differ += err > 0;
          worst = std::max(worst, err / delta);
          ++steps;
        }
      }
    }
  }
  std::printf("measured (%s): %lld of %lld steps differ from the exact sum; max err/delta %.3g "
              "(delta = %.3g (|c| + sum |a b|))\n", path_name(path), static_cast<long long>(differ),
              static_cast<long long>(steps), worst, kBf16MmaStepRel);
}

INSTANTIATE_TEST_SUITE_P(Paths, Bf16MmaModel, ::testing::Values(Path::kMmaSync, Path::kWgmma),
                         [](const auto& info) { return std::string(info.param == Path::kWgmma ? "wgmma" : "mma_sync"); });

TEST(Exp2Model, WithinTwoUlps) {
  DSV41_SKIP_WITHOUT_DEVICE();
  std::vector<float> x;
  for (int i = 0; i <= 200000; ++i) x.push_back(-126.0f * static_cast<float>(i) / 200000.0f);
  std::uniform_real_distribution<float> r(-30.0f, 0.0f);
  for (int i = 0; i < 100000; ++i) x.push_back(r(rng()));
  gpu::DeviceBuffer<float> dx(x.size()), dy(x.size());
  dx.upload(x);
  gpu::exp2_probe(dx.get(), static_cast<int64_t>(x.size()), dy.get());
  const std::vector<float> y = dy.download();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::exp2(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - e) / e);
  }
  std::printf("measured: exp2f max relative error %.3g = %.2f u32 over %zu arguments in [-126, 0] (bound: 4 u32)\n",
              worst, worst / 0x1p-24, x.size());
  EXPECT_LE(worst, 4 * 0x1p-24);
}

struct Case {
  const char* name;
  int64_t T, H, D, window_rows, compressed_rows, Kw, Kc;  // K = Kw + Kc index columns
  float q_scale;
  bool prefill;     // window columns: row t reads window rows 0 .. t (-1 after); else all window rows
  double minus_one; // share of -1 among the compressed columns
  int kernel = 0;  // 0: CudaOps (wgmma, P in registers); 1: mma.sync (cuda/attention_mma.cu); 2: wgmma, P in shared;
                   // 3: CudaOps with DSV41_CUDA_ATTN_SPLIT=1 (the split where its pick splits; the bound's slice_blocks)
};

// A kernel variant directly (1: mma.sync, 2: wgmma with P in shared memory) on bf16 copies of q and the KV rows.
reference::Tensor<float> run_variant(int kernel, const reference::Tensor<float>& q, const reference::Tensor<float>& kv,
                                     const reference::Tensor<float>& sink, const reference::Tensor<int32_t>& idxs,
                                     float scale) {
  const auto bits16 = [](const reference::Tensor<float>& t) {
    std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_bits(t.data()[i]);
    return v;
  };
  gpu::DeviceBuffer<uint16_t> dq(static_cast<size_t>(q.numel())), dkv(static_cast<size_t>(kv.numel()));
  dq.upload(bits16(q));
  dkv.upload(bits16(kv));
  gpu::DeviceBuffer<int32_t> di(static_cast<size_t>(idxs.numel()));
  di.upload(idxs.data());
  gpu::DeviceBuffer<float> ds(static_cast<size_t>(sink.numel())), dout(static_cast<size_t>(q.numel()));
  ds.upload(sink.data());
  dout.poison();
  if (kernel == 1) {
    gpu::sparse_attn_mma(dq.get(), dkv.get(), di.get(), ds.get(), q.dim(0), q.dim(1), q.dim(2), idxs.dim(1), scale,
                         dout.get());
  } else {
    gpu::sparse_attn_wgmma(dq.get(), dkv.get(), di.get(), ds.get(), q.dim(0), q.dim(1), q.dim(2), idxs.dim(1), scale,
                           dout.get(), gpu::AttnWgmmaVariant::kSharedP);
  }
  return reference::Tensor<float>(q.shape(), dout.download(), "out");
}

struct Stats {
  double worst = 0, worst_vs_ref = 0, ulps_sum = 0;
  int64_t n = 0, tight = 0, nonzero = 0, differ_ref = 0, failures = 0;
};

void run_case(const Case& c, Stats& st) {
  const reference::Tensor<float> q = random_bf16({c.T, c.H, c.D}, c.q_scale, "q");
  // Window rows: FP8-QDQ values (what the window cache returns); compressed rows: packed FP4 entries.
  const reference::Tensor<float> window =
      reference::qdq(CacheFormat::kWindowKvFp8, random_bf16({c.window_rows, c.D}, 1.0f, "window_kv"));
  std::vector<float> sink_v(static_cast<size_t>(c.H));
  std::normal_distribution<float> sd(0.0f, 2.0f);
  for (float& v : sink_v) v = sd(rng());
  const reference::Tensor<float> sink({c.H}, sink_v, "sink");
  const CacheFormat f = CacheFormat::kCompressedKvFp4;
  reference::Tensor<uint8_t> storage({c.compressed_rows, formats::entry_bytes(f, static_cast<int>(c.D))}, "compressed");
  std::vector<int64_t> entries(static_cast<size_t>(c.compressed_rows));
  for (int64_t i = 0; i < c.compressed_rows; ++i) entries[static_cast<size_t>(i)] = i;
  reference::write_entries(storage, f, entries, random_bf16({c.compressed_rows, c.D}, 1.0f, "latents"));
  const reference::CacheRows rows{f, c.D, c.compressed_rows, &storage};
  const int64_t K = c.Kw + c.Kc;
  reference::Tensor<int32_t> idxs({c.T, K}, "idxs", -1);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.compressed_rows) - 1);
  std::bernoulli_distribution none(c.minus_one);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.Kw; ++j) idxs.at(t, j) = (!c.prefill || j <= t) ? static_cast<int32_t>(j) : -1;
    for (int64_t j = 0; j < c.Kc; ++j)
      idxs.at(t, c.Kw + j) = none(rng()) ? -1 : static_cast<int32_t>(c.window_rows + pick(rng()));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const reference::Tensor<float> want = ref_ops().sparse_attn(q, window, rows, sink, idxs, scale);
  const reference::Tensor<float> kv = reference::concat_kv_rows(window, reference::read_all_entries(rows));
  int64_t slice_blocks = 0;  // the split's, for the bound (kernel 3)
  if (c.kernel == 3) {
    slice_blocks = gpu::sparse_attn_wgmma_split_pick(c.T, c.H, K);
    EXPECT_GT(slice_blocks, 0) << c.name << ": the pick does not split this shape";
    setenv("DSV41_CUDA_ATTN_SPLIT", "1", 1);
  }
  const reference::Tensor<float> got =
      c.kernel == 1 || c.kernel == 2
          ? run_variant(c.kernel, q, kv, sink, idxs, scale)
          : production_ops().download(production_ops().sparse_attn(q, window, rows, sink, idxs, scale));
  unsetenv("DSV41_CUDA_ATTN_SPLIT");
  ASSERT_EQ(got.shape(), want.shape());
  Stats local;
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<const float*> r(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j) r[static_cast<size_t>(j)] = idxs.at(t, j) < 0 ? nullptr : kv.row(idxs.at(t, j));
    for (int64_t h = 0; h < c.H; ++h) {
      const float sk = sink.data()[static_cast<size_t>(h)];
      const auto bm =
          scenarios::judge::sparse_attn_row_bound(q.row(t, h), r, c.D, sk, scale, AttnArith::kMma, slice_blocks);
      const auto br = scenarios::judge::sparse_attn_row_bound(q.row(t, h), r, c.D, sk, scale, AttnArith::kReference);
      double row_max = 0;
      for (int64_t d = 0; d < c.D; ++d) row_max = std::max(row_max, std::fabs(bm.exact[static_cast<size_t>(d)]));
      const double ulp_row = row_max > 0 ? std::ldexp(1.0, std::ilogb(row_max) - 7) : 0x1p-133;
      for (int64_t d = 0; d < c.D; ++d) {
        const size_t i = static_cast<size_t>(d);
        const float g = got.at(t, h, d), w = want.at(t, h, d);
        ASSERT_TRUE(std::isfinite(g)) << c.name << " t " << t << " h " << h << " d " << d;
        if (g != formats::round_to_bf16(g)) ++local.failures;  // not a bf16 value
        local.nonzero += g != 0.0f;
        const double slack = 0x1p-40 * std::fabs(bm.exact[i]);  // the double evaluation of the exact value
        const double err = std::fabs(static_cast<double>(g) - bm.exact[i]);
        const double err_ref = std::fabs(static_cast<double>(g) - w);
        if (err > bm.bound[i] + slack || err_ref > bm.bound[i] + br.bound[i] + 2 * slack) {
          if (++local.failures <= 5) {
            ADD_FAILURE() << c.name << " t " << t << " h " << h << " d " << d << ": got " << g << " exact "
                          << bm.exact[i] << " bound " << bm.bound[i] << "; reference " << w << " its bound "
                          << br.bound[i];
          }
        }
        if (bm.bound[i] > 0) local.worst = std::max(local.worst, err / bm.bound[i]);
        if (bm.bound[i] + br.bound[i] > 0) local.worst_vs_ref = std::max(local.worst_vs_ref, err_ref / (bm.bound[i] + br.bound[i]));
        if (row_max > 0) {
          local.ulps_sum += bm.bound[i] / ulp_row;
          local.tight += bm.bound[i] <= 1.5 * ulp_row;
          ++local.n;
        }
        local.differ_ref += g != w;
      }
    }
  }
  EXPECT_GT(local.nonzero, 0) << c.name << ": all outputs zero";
  EXPECT_EQ(local.failures, 0) << c.name << ": outputs outside the bound";
  const double n = static_cast<double>(std::max<int64_t>(local.n, 1));
  std::printf("%-22s T %3lld H %3lld D %3lld K %3lld: max err/bound %.3f (vs reference: %.3f of both bounds); bound mean "
              "%.3f bf16 ulps of the row max, %.1f%% within 1.5 ulps; %.2f%% of outputs differ from the reference's\n",
              c.name, static_cast<long long>(c.T), static_cast<long long>(c.H), static_cast<long long>(c.D),
              static_cast<long long>(K), local.worst, local.worst_vs_ref, local.ulps_sum / n, 100.0 * local.tight / n,
              100.0 * static_cast<double>(local.differ_ref) / static_cast<double>(c.T * c.H * c.D));
  st.worst = std::max(st.worst, local.worst);
  st.tight += local.tight;
  st.n += local.n;
}

TEST(ProductionSparseAttn, WithinTheDerivedBound) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Case cases[] = {
      {"decode, d 512", 8, 64, 512, 128, 1024, 128, 512, 1.0f, false, 0.05},
      {"prefill-like, d 512", 12, 64, 512, 128, 512, 128, 512, 1.0f, true, 0.0},
      {"sharp (q x 8), d 512", 4, 64, 512, 128, 512, 128, 512, 8.0f, false, 0.3},
      {"tiny config, d 128", 6, 4, 128, 16, 64, 16, 40, 1.0f, true, 0.2},
      {"72 heads, d 256", 3, 72, 256, 64, 128, 1, 64, 2.0f, false, 0.5},
      {"mostly -1, d 512", 3, 64, 512, 64, 128, 64, 70, 1.0f, true, 0.97},
      {"mma.sync: decode", 4, 64, 512, 128, 1024, 128, 512, 1.0f, false, 0.05, 1},
      {"mma.sync: tiny", 4, 4, 128, 16, 64, 16, 40, 1.0f, true, 0.2, 1},
      {"wgmma sP: decode", 4, 64, 512, 128, 1024, 128, 512, 1.0f, false, 0.05, 2},
      {"wgmma sP: 72 heads", 3, 72, 256, 64, 128, 1, 64, 2.0f, false, 0.5, 2},
      {"split: decode B 1", 4, 64, 512, 128, 2048, 128, 512, 1.0f, false, 0.02, 3},
      {"split: sharp, -1s", 2, 64, 512, 128, 512, 128, 512, 8.0f, false, 0.5, 3},
      {"split: tiny config", 4, 4, 128, 16, 64, 16, 240, 1.0f, true, 0.2, 3},
  };
  Stats st;
  for (const Case& c : cases) run_case(c, st);
  std::printf("all cases: max err/bound %.3f; %.1f%% of outputs with a bound within 1.5 bf16 ulps of the row max\n",
              st.worst, 100.0 * static_cast<double>(st.tight) / static_cast<double>(std::max<int64_t>(st.n, 1)));
  EXPECT_GE(static_cast<double>(st.tight), 0.9 * static_cast<double>(st.n)) << "the bound is vacuous";
}

// The coalesced gather changes only which thread copies which 16 bytes of a KV tile: its outputs
// must be kRowGather's bit for bit.
TEST(ProductionSparseAttn, CoalescedGatherSameBitsAsRowGather) {
  DSV41_SKIP_WITHOUT_DEVICE();
  struct Shape {
    int64_t T, H, D, N, K;
    double minus_one;
    float q_scale;
  };
  const Shape shapes[] = {{8, 64, 512, 1200, 640, 0.05, 1.0f}, {5, 64, 512, 300, 130, 0.5, 8.0f},
                          {3, 72, 256, 200, 65, 0.2, 2.0f},    {6, 4, 128, 80, 56, 0.2, 1.0f},
                          {2, 64, 512, 50, 1, 0.0, 1.0f}};
  for (const Shape& sh : shapes) {
    const auto bits16 = [](const reference::Tensor<float>& t) {
      std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_bits(t.data()[i]);
      return v;
    };
    std::vector<int32_t> hidx(static_cast<size_t>(sh.T * sh.K));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(sh.N) - 1);
    std::bernoulli_distribution none(sh.minus_one);
    for (int32_t& v : hidx) v = none(rng()) ? -1 : pick(rng());
    gpu::DeviceBuffer<uint16_t> dq(static_cast<size_t>(sh.T * sh.H * sh.D)), dkv(static_cast<size_t>(sh.N * sh.D));
    dq.upload(bits16(random_bf16({sh.T, sh.H, sh.D}, sh.q_scale, "q")));
    dkv.upload(bits16(random_bf16({sh.N, sh.D}, 1.0f, "kv")));
    gpu::DeviceBuffer<int32_t> di(hidx.size());
    di.upload(hidx);
    gpu::DeviceBuffer<float> ds(static_cast<size_t>(sh.H));
    ds.upload(random_bf16({sh.H}, 2.0f, "sink").data());
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.D));
    const size_t n = static_cast<size_t>(sh.T * sh.H * sh.D);
    gpu::DeviceBuffer<float> old_f(n), new_f(n);
    gpu::DeviceBuffer<uint16_t> old_b(n), new_b(n);
    old_f.poison();
    new_f.poison();
    old_b.poison();
    new_b.poison();
    const auto run = [&](gpu::AttnWgmmaVariant v, float* out_f, uint16_t* out_b) {
      gpu::sparse_attn_wgmma(dq.get(), dkv.get(), di.get(), ds.get(), sh.T, sh.H, sh.D, sh.K, scale, out_f, v);
      gpu::sparse_attn_wgmma_bf16(dq.get(), dkv.get(), di.get(), ds.get(), sh.T, sh.H, sh.D, sh.K, scale, out_b, v);
    };
    run(gpu::AttnWgmmaVariant::kRowGather, old_f.get(), old_b.get());
    run(gpu::AttnWgmmaVariant::kCoalesced, new_f.get(), new_b.get());
    const std::vector<float> of = old_f.download(), nf = new_f.download();
    const std::vector<uint16_t> ob = old_b.download(), nb = new_b.download();
    int64_t differ = 0, nonzero = 0, first = -1;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(of[i])) << "row gather, shape T " << sh.T << " D " << sh.D << " output " << i;
      const bool same = bits(of[i]) == bits(nf[i]) && ob[i] == nb[i];
      if (!same && first < 0) first = static_cast<int64_t>(i);
      differ += !same;
      nonzero += nf[i] != 0.0f;
    }
    std::printf("coalesced vs row gather, T %lld H %lld D %lld K %lld: %lld of %zu outputs differ (fp32 or bf16)\n",
                static_cast<long long>(sh.T), static_cast<long long>(sh.H), static_cast<long long>(sh.D),
                static_cast<long long>(sh.K), static_cast<long long>(differ), n);
    EXPECT_EQ(differ, 0) << "T " << sh.T << " H " << sh.H << " D " << sh.D << " K " << sh.K << ": first at " << first
                         << " (row gather " << (first >= 0 ? of[static_cast<size_t>(first)] : 0.0f) << ", coalesced "
                         << (first >= 0 ? nf[static_cast<size_t>(first)] : 0.0f) << ")";
    EXPECT_GT(nonzero, 0) << "T " << sh.T << " D " << sh.D << ": all outputs zero";
  }
}

// The split (flash-decoding) kernel directly: slices of 1, 2, 3 blocks within the split bound
// (scenarios/judge/sparse_attn_mma_bound.h, slice_blocks), fp32 and bf16 outputs the same values,
// and one slice (slice_blocks >= the row's blocks) the unsplit kernel's bits.
TEST(ProductionSparseAttn, SplitWithinItsBoundOneSliceSameBits) {
  DSV41_SKIP_WITHOUT_DEVICE();
  struct Shape {
    int64_t T, H, D, N, K, slice_blocks;
    double minus_one;
    float q_scale;
  };
  const Shape shapes[] = {{4, 64, 512, 1200, 640, 1, 0.02, 1.0f}, {4, 64, 512, 1200, 640, 3, 0.02, 1.0f},
                          {3, 72, 256, 300, 130, 1, 0.3, 4.0f},   {6, 4, 128, 80, 200, 2, 0.9, 1.0f},
                          {4, 64, 512, 1200, 640, 10, 0.02, 1.0f}, {3, 72, 256, 300, 130, 64, 0.3, 4.0f},
                          {2, 64, 512, 50, 1, 1, 0.0, 1.0f}};
  for (const Shape& sh : shapes) {
    const auto bits16 = [](const reference::Tensor<float>& t) {
      std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_bits(t.data()[i]);
      return v;
    };
    reference::Tensor<int32_t> idx({sh.T, sh.K}, "idxs");
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(sh.N) - 1);
    std::bernoulli_distribution none(sh.minus_one);
    for (int32_t& v : idx.data()) v = none(rng()) ? -1 : pick(rng());
    if (sh.T > 2) std::fill(idx.row(sh.T - 1), idx.row(sh.T - 1) + sh.K, -1);  // a row of only -1
    const reference::Tensor<float> q = random_bf16({sh.T, sh.H, sh.D}, sh.q_scale, "q");
    const reference::Tensor<float> kv = random_bf16({sh.N, sh.D}, 1.0f, "kv");
    const reference::Tensor<float> sink = random_bf16({sh.H}, 2.0f, "sink");
    gpu::DeviceBuffer<uint16_t> dq(static_cast<size_t>(q.numel())), dkv(static_cast<size_t>(kv.numel()));
    dq.upload(bits16(q));
    dkv.upload(bits16(kv));
    gpu::DeviceBuffer<int32_t> di(static_cast<size_t>(idx.numel()));
    di.upload(idx.data());
    gpu::DeviceBuffer<float> ds(static_cast<size_t>(sh.H));
    ds.upload(sink.data());
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.D));
    const size_t n = static_cast<size_t>(sh.T * sh.H * sh.D);
    const int64_t ws_bytes = gpu::sparse_attn_wgmma_split_workspace_bytes(sh.T, sh.H, sh.D, sh.K, sh.slice_blocks);
    gpu::DeviceBuffer<float> ws(static_cast<size_t>(ws_bytes / 4)), split_f(n), plain_f(n);
    gpu::DeviceBuffer<uint16_t> split_b(n), plain_b(n);
    ws.poison();
    split_f.poison();
    split_b.poison();
    plain_f.poison();
    plain_b.poison();
    gpu::sparse_attn_wgmma_split(dq.get(), dkv.get(), di.get(), ds.get(), sh.T, sh.H, sh.D, sh.K, scale,
                                 split_f.get(), sh.slice_blocks, ws.get());
    gpu::sparse_attn_wgmma_split_bf16(dq.get(), dkv.get(), di.get(), ds.get(), sh.T, sh.H, sh.D, sh.K, scale,
                                      split_b.get(), sh.slice_blocks, ws.get());
    gpu::sparse_attn_wgmma(dq.get(), dkv.get(), di.get(), ds.get(), sh.T, sh.H, sh.D, sh.K, scale, plain_f.get());
    gpu::sparse_attn_wgmma_bf16(dq.get(), dkv.get(), di.get(), ds.get(), sh.T, sh.H, sh.D, sh.K, scale,
                                plain_b.get());
    const std::vector<float> sf = split_f.download(), pf = plain_f.download();
    const std::vector<uint16_t> sb = split_b.download(), pb = plain_b.download();
    const int64_t blocks = (sh.K + 63) / 64;
    const bool one_slice = sh.slice_blocks >= blocks;
    int64_t outside = 0, nonzero = 0, differ_plain = 0, differ_bf16 = 0;
    double worst = 0;
    for (int64_t t = 0; t < sh.T; ++t) {
      std::vector<const float*> rows(static_cast<size_t>(sh.K));
      for (int64_t j = 0; j < sh.K; ++j) rows[static_cast<size_t>(j)] = idx.at(t, j) < 0 ? nullptr : kv.row(idx.at(t, j));
      for (int64_t h = 0; h < sh.H; ++h) {
        const auto bm = scenarios::judge::sparse_attn_row_bound(q.row(t, h), rows, sh.D, sink.data()[static_cast<size_t>(h)],
                                                                scale, AttnArith::kMma, sh.slice_blocks);
        for (int64_t d = 0; d < sh.D; ++d) {
          const size_t i = static_cast<size_t>((t * sh.H + h) * sh.D + d), k = static_cast<size_t>(d);
          ASSERT_TRUE(std::isfinite(sf[i])) << "split, T " << sh.T << " D " << sh.D << " output " << i;
          const double err = std::fabs(static_cast<double>(sf[i]) - bm.exact[k]);
          const double b = bm.bound[k] + 0x1p-40 * std::fabs(bm.exact[k]);
          if (err > b && ++outside <= 5) {
            ADD_FAILURE() << "split " << sh.slice_blocks << ", T " << sh.T << " H " << sh.H << " D " << sh.D << " t "
                          << t << " h " << h << " d " << d << ": got " << sf[i] << " exact " << bm.exact[k]
                          << " bound " << bm.bound[k];
          }
          if (bm.bound[k] > 0) worst = std::max(worst, err / bm.bound[k]);
          nonzero += sf[i] != 0.0f;
          differ_bf16 += bf16_bits(sf[i]) != sb[i];
          differ_plain += bits(sf[i]) != bits(pf[i]) || sb[i] != pb[i];
        }
      }
    }
    std::printf("split, slices of %lld blocks, T %lld H %lld D %lld K %lld: max err/bound %.3f; %lld of %zu outputs "
                "differ from the unsplit kernel's%s\n",
                static_cast<long long>(sh.slice_blocks), static_cast<long long>(sh.T), static_cast<long long>(sh.H),
                static_cast<long long>(sh.D), static_cast<long long>(sh.K), worst, static_cast<long long>(differ_plain),
                n, one_slice ? " (one slice: must be 0)" : "");
    EXPECT_EQ(outside, 0) << "split outside its bound";
    EXPECT_GT(nonzero, 0) << "split: all outputs zero";
    EXPECT_EQ(differ_bf16, 0) << "split: the fp32 and bf16 outputs disagree";
    if (one_slice) {
      EXPECT_EQ(differ_plain, 0) << "one slice: not the unsplit kernel's bits";
    }
  }
  EXPECT_THROW(gpu::sparse_attn_wgmma_split(nullptr, nullptr, nullptr, nullptr, 1, 64, 512, 64, 1.0f, nullptr, 0,
                                            nullptr),
               Error);
}

TEST(ProductionSparseAttn, RowsOfOnlyMinusOneGiveZero) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::Tensor<float> q = random_bf16({2, 64, 512});
  const reference::Tensor<float> window = random_bf16({8, 512});
  const reference::Tensor<float> sink = random_bf16({64});
  const reference::Tensor<int32_t> idxs({2, 70}, "idxs", -1);
  const reference::Tensor<uint8_t> no_bytes({0, formats::entry_bytes(CacheFormat::kCompressedKvFp4, 512)}, "none");
  const reference::CacheRows none{CacheFormat::kCompressedKvFp4, 512, 0, &no_bytes};
  const reference::Tensor<float> got =
      production_ops().download(production_ops().sparse_attn(q, window, none, sink, idxs, 0.0441941738f));
  for (const float v : got.data()) EXPECT_EQ(v, 0.0f);
}

TEST(ProductionSparseAttn, ProductionOpsEnvironment) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const reference::Tensor<float> q = random_bf16({3, 64, 512});
  const reference::Tensor<float> window = random_bf16({100, 512});
  const reference::Tensor<float> sink = random_bf16({64});
  reference::Tensor<int32_t> idxs({3, 100}, "idxs");
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t j = 0; j < 100; ++j) idxs.at(t, j) = static_cast<int32_t>((j * 7 + t) % 100);
  const reference::Tensor<uint8_t> no_bytes({0, formats::entry_bytes(CacheFormat::kCompressedKvFp4, 512)}, "none");
  const reference::CacheRows none{CacheFormat::kCompressedKvFp4, 512, 0, &no_bytes};
  const float scale = 0.0441941738f;
  const reference::Tensor<float> want = ref_ops().sparse_attn(q, window, none, sink, idxs, scale);
  setenv("DSV41_CUDA_PRODUCTION_OPS", "linear", 1);
  {
    const gpu::CudaOps only_linear(gpu::CudaMode::kProduction);
    EXPECT_TRUE(only_linear.production("linear"));
    EXPECT_FALSE(only_linear.production("sparse_attn"));
    EXPECT_TRUE(same_bits(want, only_linear.sparse_attn(q, window, none, sink, idxs, scale)));
  }
  setenv("DSV41_CUDA_PRODUCTION_OPS", "sparse_attn", 1);
  {
    const gpu::CudaOps only_attn(gpu::CudaMode::kProduction);
    EXPECT_FALSE(only_attn.production("linear"));
    EXPECT_TRUE(only_attn.production("sparse_attn"));
  }
  setenv("DSV41_CUDA_PRODUCTION_OPS", "linear,attention", 1);
  EXPECT_THROW(gpu::CudaOps(gpu::CudaMode::kProduction), Error);
  unsetenv("DSV41_CUDA_PRODUCTION_OPS");
  const gpu::CudaOps all(gpu::CudaMode::kProduction);
  EXPECT_TRUE(all.production("linear") && all.production("sparse_attn"));
  EXPECT_FALSE(cuda_ops().production("sparse_attn"));  // kExact: never
}

}  // namespace
}  // namespace dsv41::test
