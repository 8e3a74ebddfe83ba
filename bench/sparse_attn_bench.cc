// bench/sparse_attn_bench.cc: dsv41_sparse_attn_bench, the production sparse attention
// (cuda/attention_wgmma.cu, backend `cuda`; and its mma.sync variant cuda/attention_mma.cu) at issue
// 32's shapes, beside the exact kernel's three stages (cuda/attention.cu, backend `cuda-exact`). bench/sparse_attn.sh runs it after
// bench/sparse_attn_torch.py (torch eager and the bf16 matmul peak, same call).
//
// Shapes and index rows are bench/kernels_bench.cc's attention rows: h 64, d 512, k 640 (128 window
// + 512 compressed indices). Decode B: B sequences x s_q 4 queries, each sequence 128 window rows +
// 2048 compressed rows, query i reading the window and compressed rows j*4 + i. Prefill: T 4096
// over 4096 window rows + 1024 compressed rows, query t reading window rows max(0, t-127) .. t (-1
// past t) and 512 compressed rows (t*37 + 2j) % 1024.
// The production kernel reads q and kv as bf16 (the production format) and writes bf16; the exact
// stages read fp32 storage (the backend's). Medians of CUDA-event timings, each after a 256 MiB L2
// flush (bench/bench_device.h). TFLOP/s = 2 T H K (512 + 512) / median (FlashMLA's count).
// Checked before timing: 4 query rows x 64 heads of each kernel's output (poisoned first) against the derived
// bound (scenarios/judge/sparse_attn_mma_bound.h); a FAIL is printed instead of the time.
//
// Kernels: 0 mma.sync (cuda/attention_mma.cu), 1 wgmma sP (P . V with P from a shared tile), 2 wgmma rP
// (P from registers, the row-per-thread gather: session 15's production kernel), 3 wgmma coal (P from
// registers, each warp gathering whole rows: the production default). Kernel 3's output is also
// compared bit for bit with kernel 2's (the same arithmetic): "bits = rP" or "bits DIFFER".
// Kernel 4, wgmma split: kernel 3 with each row's index list split over CTAs (flash-decoding, the
// partials combined by a second kernel; cuda/attention_wgmma.cu "Split"), slices of
// --slice-blocks N 64-blocks, else sparse_attn_wgmma_split_pick's (decode B 1: 1 block, 10 slices),
// else (the pick does not split, e.g. B 64) 5 blocks (2 slices); checked against the split's bound
// (slice_blocks), timed with its combine.
// Usage: dsv41_sparse_attn_bench [--peak TFLOPS] [--exact] [--only decode|prefill|B64|B1] [--kernel 0|1|2|3|4]
//        [--reps N] [--slice-blocks N]   (--exact: also time the exact stages)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_device.h"
#include "cuda/device.h"
#include "cuda/attention_split.h"
#include "cuda/kernels.h"
#include "formats/minifloat.h"
#include "scenarios/judge/sparse_attn_mma_bound.h"

namespace dsv41::bench {
namespace {

using gpu::DeviceBuffer;

struct Shape {
  const char* name;
  int64_t B;  // 0: prefill T 4096
};

std::vector<float> bf16_values(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(b[i]) << 16;
    std::memcpy(&v[i], &u, 4);
  }
  return v;
}

int only_kernel = -1, reps_override = 0;
int64_t slice_override = 0;

void run(const Shape& sh, double peak, bool exact) {
  const bool prefill = sh.B == 0;
  const int64_t sq = 4, H = 64, D = 512, K = 640, W = 128, C = prefill ? 1024 : 2048;
  const int64_t T = prefill ? 4096 : sh.B * sq, N = prefill ? T + C : sh.B * (W + C);
  DeviceBuffer<float> qf(static_cast<size_t>(T * H * D)), kvf(static_cast<size_t>(N * D)), sink(H);
  fill_bf16(qf.get(), static_cast<int64_t>(qf.size()), D, 31u, 0, 1);
  fill_bf16(kvf.get(), static_cast<int64_t>(kvf.size()), D, 32u, -1, 0);
  fill_f32(sink.get(), H, 33u, -1.0f, 2.0f);
  DeviceBuffer<uint16_t> q(qf.size()), kv(kvf.size()), out(static_cast<size_t>(T * H * D));
  DeviceBuffer<int> flag(1);
  flag.upload(std::vector<int>{0});
  gpu::to_bf16_bits(qf.get(), static_cast<int64_t>(qf.size()), q.get(), flag.get());
  gpu::to_bf16_bits(kvf.get(), static_cast<int64_t>(kvf.size()), kv.get(), flag.get());
  std::vector<int32_t> hidx(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = t / sq, i = t % sq, lo = std::max<int64_t>(0, t - W + 1);
    for (int64_t j = 0; j < K; ++j) {
      int64_t v = 0;
      if (!prefill) v = b * (W + C) + (j < W ? j : W + ((j - W) * sq + i) % C);
      else if (j < W) v = lo + j > t ? -1 : lo + j;
      else v = T + (t * 37 + 2 * (j - W)) % C;
      hidx[static_cast<size_t>(t * K + j)] = static_cast<int32_t>(v);
    }
  }
  DeviceBuffer<int32_t> idxs(hidx.size());
  idxs.upload(hidx);
  const float scale = 1.0f / std::sqrt(512.0f);
  const double flops = 2.0 * double(T) * H * K * (512 + 512);
  const auto wgmma = [&](gpu::AttnWgmmaVariant v) {
    gpu::sparse_attn_wgmma_bf16(q.get(), kv.get(), idxs.get(), sink.get(), T, H, D, K, scale, out.get(), v);
  };
  const int64_t picked = gpu::sparse_attn_wgmma_split_pick(T, H, K);
  const int64_t slice_blocks = slice_override > 0 ? slice_override : picked > 0 ? picked : 5;
  DeviceBuffer<float> ws(static_cast<size_t>(gpu::sparse_attn_wgmma_split_workspace_bytes(T, H, D, K, slice_blocks) / 4));
  constexpr int kKernels = 5;
  const std::function<void(int)> kernels[kKernels] = {
      [&](int) { gpu::sparse_attn_mma_bf16(q.get(), kv.get(), idxs.get(), sink.get(), T, H, D, K, scale, out.get()); },
      [&](int) { wgmma(gpu::AttnWgmmaVariant::kSharedP); }, [&](int) { wgmma(gpu::AttnWgmmaVariant::kRowGather); },
      [&](int) { wgmma(gpu::AttnWgmmaVariant::kCoalesced); },
      [&](int) {
        gpu::sparse_attn_wgmma_split_bf16(q.get(), kv.get(), idxs.get(), sink.get(), T, H, D, K, scale, out.get(),
                                          slice_blocks, ws.get());
      }};
  static const char* const names[kKernels] = {"mma.sync", "wgmma sP", "wgmma rP", "wgmma coal", "wgmma split"};
  std::vector<uint16_t> row_gather_bits;  // kernel 2's output, for kernel 3's bit comparison
  const std::vector<float> hq = bf16_values(q.download()), hkv = bf16_values(kv.download()), hs = sink.download();
  for (int kernel = 0; kernel < kKernels; ++kernel) {
    if (only_kernel >= 0 && kernel != only_kernel) continue;
    // Check 4 query rows against the derived bound (the output poisoned first).
    std::string check = flag.download()[0] == 0 ? "ok" : "FAIL inputs not bf16";
    out.poison();
    kernels[kernel](0);
    gpu::synchronize();
    double worst = 0;
    const std::vector<uint16_t> hbits = out.download();
    const std::vector<float> ho = bf16_values(hbits);
    if (kernel == 2 || (kernel == 3 && row_gather_bits.empty())) {
      if (kernel == 3) {  // kernel 2 was not asked for: run it for the comparison
        wgmma(gpu::AttnWgmmaVariant::kRowGather);
        gpu::synchronize();
      }
      row_gather_bits = kernel == 2 ? hbits : out.download();
    }
    std::string same = kernel != 3 ? "" : hbits == row_gather_bits ? ", bits = rP" : ", bits DIFFER from rP";
    if (kernel == 4) {
      same = ", slices of " + std::to_string(slice_blocks) + " blocks: " +
             std::to_string((K + 64 * slice_blocks - 1) / (64 * slice_blocks)) + " slices" +
             (picked > 0 ? " (picked)" : " (forced: the pick does not split)");
    }
    if (kernel == 3 && hbits != row_gather_bits) check = "FAIL bits differ from the row gather's";
    for (const int64_t t : {int64_t{0}, int64_t{1}, T - 2, T - 1}) {
      std::vector<const float*> rows(static_cast<size_t>(K));
      for (int64_t j = 0; j < K; ++j) {
        const int32_t ix = hidx[static_cast<size_t>(t * K + j)];
        rows[static_cast<size_t>(j)] = ix < 0 ? nullptr : hkv.data() + static_cast<int64_t>(ix) * D;
      }
      for (int64_t h = 0; h < H; ++h) {
        const auto bd = scenarios::judge::sparse_attn_row_bound(hq.data() + (t * H + h) * D, rows, D, hs[h], scale,
                                                                scenarios::judge::AttnArith::kMma,
                                                                kernel == 4 ? slice_blocks : 0);
        for (int64_t d = 0; d < D; ++d) {
          const double g = ho[static_cast<size_t>((t * H + h) * D + d)], e = bd.exact[static_cast<size_t>(d)];
          const double b = bd.bound[static_cast<size_t>(d)] + 0x1p-40 * std::fabs(e);
          if (!std::isfinite(g) || std::fabs(g - e) > b) check = "FAIL outside the bound";
          if (b > 0) worst = std::max(worst, std::fabs(g - e) / b);
        }
      }
    }
    const int reps = reps_override > 0 ? reps_override : prefill ? 20 : 50;
    const std::vector<double> ms = time_ms(3, reps, 1, kernels[kernel]);
    const double us = ms[ms.size() / 2] * 1e3;
    std::printf("%-10s %-10s T %5lld: %9.1f us  %7.1f TFLOP/s  %5.1f%% of peak %.0f  (check %s, max err/bound %.3f%s)\n",
                sh.name, names[kernel], static_cast<long long>(T), us, flops / us / 1e6,
                100.0 * flops / us / 1e6 / peak, peak, check.c_str(), worst, same.c_str());
  }
  if (!exact) return;
  DeviceBuffer<float> s(static_cast<size_t>(T * H * K)), p(s.size()), rescale(static_cast<size_t>(T * H * (K / 64))),
      l(static_cast<size_t>(T * H)), outf(static_cast<size_t>(T * H * D));
  const auto ex = [&](int) {
    gpu::sparse_attn_scores(qf.get(), kvf.get(), idxs.get(), T, H, D, K, scale, s.get());
    gpu::sparse_attn_softmax(s.get(), sink.get(), T, H, K, p.get(), rescale.get(), l.get());
    gpu::sparse_attn_pv(kvf.get(), idxs.get(), p.get(), rescale.get(), l.get(), T, H, D, K, outf.get());
  };
  const std::vector<double> me = time_ms(1, prefill ? 5 : 20, 1, ex);
  const double ue = me[me.size() / 2] * 1e3;
  std::printf("%-10s exact      T %5lld: %9.1f us  %7.1f TFLOP/s  %5.1f%% of peak %.0f\n", sh.name,
              static_cast<long long>(T), ue, flops / ue / 1e6, 100.0 * flops / ue / 1e6 / peak, peak);
}

}  // namespace
}  // namespace dsv41::bench

int main(int argc, char** argv) {
  double peak = 989;  // H100/H200 SXM dense bf16 (datasheet); pass the measured one with --peak
  bool exact = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--peak") && i + 1 < argc) peak = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--exact")) exact = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--kernel") && i + 1 < argc) dsv41::bench::only_kernel = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) dsv41::bench::reps_override = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--slice-blocks") && i + 1 < argc) dsv41::bench::slice_override = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "dsv41_sparse_attn_bench: unknown or incomplete argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (dsv41::gpu::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  for (const dsv41::bench::Shape s : {dsv41::bench::Shape{"decode B64", 64}, dsv41::bench::Shape{"decode B1", 1},
                                      dsv41::bench::Shape{"prefill", 0}}) {
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    dsv41::bench::run(s, peak, exact);
  }
  return 0;
}
