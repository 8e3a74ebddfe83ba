// bench/index_select_bench.cc: dsv41_index_select_bench, the production fused indexer
// (cuda/index_select.cu, backend `cuda`, op indexer) beside the exact twin's unfused kernels
// (cuda/indexer.cu index_scores -> a [T, N] fp32 matrix -> cuda/topk.cu), at the released index
// dims (32 heads, d 128, top-k 512, candidate blocks 2048 of 8). bench/index_select.sh runs it after
// bench/index_select_torch.py (torch eager, same call).
//
// Shapes: decode T 64 query rows x N 16384 keys (every row reaches all keys), prefill T 4096 x
// N 2048 (a ratio-2 layer's 4096-token prefill: row t reaches (t + 1) / 2 keys), and (--only long)
// the million-token decode T 64 x N 2^20 (ranges of 65536 keys and the merge). Each for the three
// layer kinds: plain (an index layer), source (the candidate source: block maxima, the block top-k,
// the mask, the position top-k), pool (a layer inside a candidate pool of 2048 blocks). Inputs:
// FP4-QDQ queries, packed FP4 index-key entries, the model's weights, made on the host.
// The exact twin reads the keys unpacked (fp32 [N, 128]; the unpack, a read_entries op of its own,
// is not timed). Medians of CUDA-event timings, each after a 256 MiB L2 flush (bench/bench_device.h).
// Checked before timing: the production top-k against the exact one (rows equal as sets, and the
// share of positions that differ: ties and near ties only; tests/cuda/index_select_production_test
// judges them). --splits R:S,... also times the fused op with ranges of R keys in clusters of S CTAs
// (IndexSelectArgs::range_keys, cluster; the default split is timed as "fused"), each without and
// with the three kernel switches (IndexSelectArgs::prefetch, ldmatrix, warp_hist); the default split
// is always also timed with each switch alone, fit_wave alone (halve the cluster until its clusters
// fit one wave), the three switches, all four, and the decode-shaped kernel (IndexSelectArgs::decode)
// without and with warp_hist; each --splits split also with the decode kernel (where its split does
// not fit that kernel the streaming one runs: the line's description says which).
// Each is checked to give the default's picks and mask bit for bit, and prints its clusters and how
// many the device holds at once (split "0:0" = the default).
// Usage: dsv41_index_select_bench [--only decode|prefill|long] [--reps N] [--splits R:S,...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_device.h"
#include "cuda/device.h"
#include "cuda/index_select.h"
#include "cuda/kernels.h"
#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "reference/ops/indexer.h"
#include "reference/ops/kv_quant.h"

namespace dsv41::bench {
namespace {

using gpu::DeviceBuffer;
using reference::Tensor;
constexpr int64_t kHeads = 32, kDim = 128, kTopk = 512, kBlocks = 2048, kBlockSize = 8;

struct Inputs {
  int64_t T, n;
  std::vector<int64_t> reach;
  std::unique_ptr<DeviceBuffer<float>> q, w, keys_f32;
  std::unique_ptr<DeviceBuffer<uint8_t>> keys, pool;
  std::unique_ptr<DeviceBuffer<int64_t>> reach_d;
};

Tensor<float> normal(std::vector<int64_t> shape, std::mt19937_64& rng, float sd) {
  Tensor<float> t(std::move(shape), "x");
  std::normal_distribution<float> d(0.0f, sd);
  for (float& v : t.data()) v = formats::round_to_bf16(d(rng));
  return t;
}

Inputs make_inputs(int64_t T, int64_t n, bool prefill) {
  std::mt19937_64 rng(20261206);
  Inputs in;
  in.T = T, in.n = n;
  const Tensor<float> q = reference::qdq(formats::CacheFormat::kIndexKeysFp4, normal({T, kHeads, kDim}, rng, 1.0f));
  const Tensor<float> w = reference::index_weights(normal({T, kHeads}, rng, 2.0f), kDim);
  const Tensor<float> rows = reference::qdq(formats::CacheFormat::kIndexKeysFp4, normal({n, kDim}, rng, 1.0f));
  Tensor<uint8_t> storage({n, formats::entry_bytes(formats::CacheFormat::kIndexKeysFp4, kDim)}, "ik");
  std::vector<int64_t> entries(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) entries[static_cast<size_t>(i)] = i;
  reference::write_entries(storage, formats::CacheFormat::kIndexKeysFp4, entries, rows);
  in.reach.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) in.reach[static_cast<size_t>(t)] = prefill ? (t + 1) * n / T : n;
  // A pool of 2048 random blocks of 8 per row (at N 16384 every block; at 2048 keys, all 256).
  Tensor<uint8_t> pool({T, n}, "pool", 0);
  const int64_t nb = (n + kBlockSize - 1) / kBlockSize;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> b(static_cast<size_t>(nb));
    for (int64_t i = 0; i < nb; ++i) b[static_cast<size_t>(i)] = i;
    std::shuffle(b.begin(), b.end(), rng);
    for (int64_t i = 0; i < std::min<int64_t>(nb / 2, kBlocks); ++i) {
      for (int64_t j = b[static_cast<size_t>(i)] * kBlockSize; j < std::min(n, (b[static_cast<size_t>(i)] + 1) * kBlockSize); ++j) {
        pool.at(t, j) = 1;
      }
    }
  }
  in.q = std::make_unique<DeviceBuffer<float>>(q.numel());
  in.q->upload(q.data());
  in.w = std::make_unique<DeviceBuffer<float>>(w.numel());
  in.w->upload(w.data());
  in.keys_f32 = std::make_unique<DeviceBuffer<float>>(rows.numel());
  in.keys_f32->upload(rows.data());
  in.keys = std::make_unique<DeviceBuffer<uint8_t>>(storage.numel());
  in.keys->upload(storage.data());
  in.pool = std::make_unique<DeviceBuffer<uint8_t>>(pool.numel());
  in.pool->upload(pool.data());
  in.reach_d = std::make_unique<DeviceBuffer<int64_t>>(in.reach.size());
  in.reach_d->upload(in.reach);
  return in;
}

struct Split {
  int64_t range_keys = 0, cluster = 0;  // 0, 0: the default
};

std::string describe(const gpu::IndexSelectArgs& a) {
  const gpu::IndexSelectSplit s = gpu::index_select_split(a);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s%d range(s) x cluster %d x %d keys/CTA, %ld clusters (device holds %d at once)%s",
                s.decode ? "decode kernel: " : "", s.ranges, s.cluster, s.keys_per_cta, static_cast<long>(s.clusters),
                s.max_active_clusters, s.merge_cluster > 0 ? ", merge" : "");
  return buf;
}

void run_shape(const char* name, int64_t T, int64_t n, bool prefill, int reps, const std::vector<Split>& splits) {
  const Inputs in = make_inputs(T, n, prefill);
  const int64_t k = std::min(kTopk, n);
  DeviceBuffer<int32_t> topk(static_cast<size_t>(T * k)), topk_exact(static_cast<size_t>(T * k));
  DeviceBuffer<int32_t> topk_split(static_cast<size_t>(T * k));
  DeviceBuffer<uint8_t> mask(static_cast<size_t>(T * n)), mask_exact(static_cast<size_t>(T * n));
  DeviceBuffer<uint8_t> mask_split(static_cast<size_t>(T * n));
  DeviceBuffer<float> scores(static_cast<size_t>(T * n));
  DeviceBuffer<int> nan_flag(1);
  nan_flag.poison(0);
  const double flops = 2.0 * T * n * kHeads * kDim;
  for (const char* kind : {"plain", "source", "pool"}) {
    const bool source = std::strcmp(kind, "source") == 0, pool = std::strcmp(kind, "pool") == 0;
    gpu::IndexSelectArgs a;
    a.q = in.q->get(), a.w = in.w->get(), a.keys = in.keys->get(), a.reach = in.reach_d->get();
    a.pool = pool ? in.pool->get() : nullptr;
    a.T = T, a.heads = kHeads, a.dim = kDim, a.n = n, a.k = k;
    a.topk_blocks = source ? kBlocks : 0, a.block_size = source ? kBlockSize : 0;
    a.topk = topk.get(), a.mask = source ? mask.get() : nullptr;
    DeviceBuffer<uint8_t> ws(static_cast<size_t>(gpu::index_select_workspace_bytes(a)));
    a.workspace = ws.get();
    const auto fused = [&](int) { gpu::index_select(a); };
    const auto exact = [&](int) {
      gpu::index_scores(in.q->get(), in.keys_f32->get(), in.w->get(), in.reach_d->get(), T, kHeads, kDim, n, scores.get());
      if (source) {
        gpu::candidate_pool_topk(scores.get(), in.reach_d->get(), T, n, k, kBlocks, kBlockSize, mask_exact.get(),
                                 topk_exact.get(), nan_flag.get());
      } else {
        gpu::index_topk_async(scores.get(), pool ? in.pool->get() : nullptr, in.reach_d->get(), T, n, k,
                              topk_exact.get(), nan_flag.get());
      }
    };
    fused(0);
    exact(0);
    const bool flagged = gpu::index_select_flagged(ws.get());
    const std::vector<int32_t> got = topk.download(), want = topk_exact.download();
    int64_t differ = 0;
    for (int64_t t = 0; t < T; ++t) {
      const std::set<int32_t> g(got.begin() + t * k, got.begin() + (t + 1) * k), w(want.begin() + t * k, want.begin() + (t + 1) * k);
      for (int32_t v : g) differ += w.count(v) == 0;
    }
    int64_t mask_differ = 0;
    if (source) {
      const std::vector<uint8_t> mg = mask.download(), mw = mask_exact.download();
      for (size_t i = 0; i < mg.size(); ++i) mask_differ += mg[i] != mw[i];
    }
    const std::vector<double> tf = time_ms(3, reps, 1, fused);
    const std::vector<double> te = time_ms(3, reps, 1, exact);
    const double mf = tf[tf.size() / 2] * 1e3, me = te[te.size() / 2] * 1e3;
    std::printf("%-8s %-6s T %5ld N %6ld  fused %9.1f us (%6.1f TOPS int8)  exact unfused %9.1f us  x%.2f  "
                "top-k positions differing %ld of %ld, mask bytes differing %ld%s\n",
                name, kind, static_cast<long>(T), static_cast<long>(n), mf, flops / (mf * 1e-6) / 1e12, me, me / mf,
                static_cast<long>(differ), static_cast<long>(T * k), static_cast<long>(mask_differ),
                flagged ? "  FLAGGED (composition would run)" : "");
    std::printf("         default split: %s\n", describe(a).c_str());
    struct Variant {
      Split s;
      bool prefetch, ldmatrix, warp_hist, fit_wave, decode;
    };
    std::vector<Variant> variants = {
        {Split{}, true, false, false, false, false}, {Split{}, false, true, false, false, false},
        {Split{}, false, false, true, false, false}, {Split{}, false, false, false, true, false},
        {Split{}, true, true, true, false, false},   {Split{}, true, true, true, true, false},
        {Split{}, false, false, false, false, true}, {Split{}, false, false, true, false, true}};
    for (const Split& s : splits) {
      variants.push_back({s, false, false, false, false, false});
      variants.push_back({s, true, true, true, false, false});
      variants.push_back({s, false, false, false, false, true});
    }
    for (const auto& [s, prefetch, ldmatrix, warp_hist, fit_wave, decode] : variants) {  // the same picks, cut otherwise
      gpu::IndexSelectArgs b = a;
      b.range_keys = s.range_keys, b.cluster = s.cluster, b.prefetch = prefetch, b.ldmatrix = ldmatrix;
      b.warp_hist = warp_hist, b.fit_wave = fit_wave, b.decode = decode;
      b.topk = topk_split.get(), b.mask = source ? mask_split.get() : nullptr;
      int64_t bytes = 0;
      try {
        bytes = gpu::index_select_workspace_bytes(b);
      } catch (const std::exception& e) {
        std::printf("         split %ld:%ld  not covered (%s)\n", static_cast<long>(s.range_keys),
                    static_cast<long>(s.cluster), e.what());
        continue;
      }
      DeviceBuffer<uint8_t> wsb(static_cast<size_t>(bytes));
      b.workspace = wsb.get();
      gpu::index_select(b);
      const bool same = topk_split.download() == got && (!source || mask_split.download() == mask.download());
      const std::vector<double> ts = time_ms(3, reps, 1, [&](int) { gpu::index_select(b); });
      const double ms = ts[ts.size() / 2] * 1e3;
      std::printf("         split %ld:%ld%s%s%s%s%s  fused %9.1f us  x%.2f vs the default  %s  %s\n",
                  static_cast<long>(s.range_keys), static_cast<long>(s.cluster), prefetch ? " prefetch" : "",
                  ldmatrix ? " ldmatrix" : "", warp_hist ? " warp_hist" : "", fit_wave ? " fit_wave" : "",
                  decode ? " decode" : "", ms, mf / ms,
                  same ? "same picks" : "PICKS DIFFER FROM THE DEFAULT", describe(b).c_str());
    }
  }
}

}  // namespace
}  // namespace dsv41::bench

int main(int argc, char** argv) {
  std::string only;
  int reps = 50;
  std::vector<dsv41::bench::Split> splits;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--splits" && i + 1 < argc) {
      const std::string list = argv[++i];
      for (size_t at = 0; at < list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        long r = 0, s = 0;
        if (std::sscanf(list.substr(at, end - at).c_str(), "%ld:%ld", &r, &s) != 2 || r <= 0 || s <= 0) {
          std::fprintf(stderr, "dsv41_index_select_bench: --splits wants R:S,... (keys per range : CTAs per cluster), got '%s'\n",
                       list.c_str());
          return 2;
        }
        splits.push_back({r, s});
        at = end + 1;
      }
    } else {
      std::fprintf(stderr, "usage: dsv41_index_select_bench [--only decode|prefill|long] [--reps N] [--splits R:S,...]\n");
      return 2;
    }
  }
  std::printf("dsv41_index_select_bench: heads 32, d 128, top-k 512, blocks 2048 of 8; CUDA runtime %s\n",
              dsv41::bench::cuda_runtime_version().c_str());
  try {
    if (only.empty() || only == "decode") dsv41::bench::run_shape("decode", 64, 16384, false, reps, splits);
    if (only.empty() || only == "prefill") dsv41::bench::run_shape("prefill", 4096, 2048, true, reps, splits);
    if (only == "long") dsv41::bench::run_shape("long", 64, int64_t{1} << 20, false, reps, splits);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41_index_select_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
