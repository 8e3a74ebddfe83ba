// bench/kernels_bench.cc: dsv41_kernels_bench, the kernel table of issue 17 (bench/run.sh runs it).
//
// Times the EXISTING cuda/ kernels (cuda/kernels.h, cuda/device.h launchers) at the shapes and
// one decode shape each. Per case: inputs made on the device (bf16 values in fp32 storage, as the
// kernels take them), rotated over enough copies to exceed 256 MiB when an input is small, plus a
// 256 MiB L2 flush before every timed launch (bench/bench_device.h); CUDA events; repetitions chosen
// so a case takes about --budget-ms (3 to 50); min / median / p90. After timing, copy 0's output is
// checked bit for bit against the CPU reference op (reference/*) on a slice of rows, and a case
// whose check fails prints FAIL instead of its time.
//
// Rates: "fmt GB/s" counts the bytes of the production format (bf16 tensors, packed caches: the
// performance.md roofline bytes) per median time; "% limit" is that over the measured H200 copy
// 4270 GB/s, or TFLOP/s over 1408 (fp8, indexer) / 751 (bf16, attention). The cuda/ kernels store
// bf16 tensors as fp32, so "moved GB/s" (bytes the kernel really reads and writes) is also given.
//
// Usage: dsv41_kernels_bench [--torch torch.txt] [--md bench.md] [--budget-ms 3000] [--only NAME]
//   torch.txt: lines "key median_us amount" from bench/torch_eager.py (same keys, same units).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench/bench_device.h"
#include "cuda/kernels.h"
#include "cuda/kernels_bf16.h"
#include "cuda/libm_expf.h"
#include "cuda/device.h"
#include "formats/cache_format.h"
#include "reference/ops/attention.h"
#include "reference/ops/engram.h"
#include "reference/ops/indexer.h"
#include "reference/ops/mhc.h"
#include "reference/seam/ops.h"
#include "reference/ops/tensor.h"

namespace dsv41::bench {
namespace {

using gpu::DeviceBuffer;
using reference::Tensor;

constexpr double kCopyGBs = 4270, kBf16TF = 751, kFp8TF = 1408;  // measured H200 ceilings
constexpr std::size_t kRotate = std::size_t{256} << 20;             // rotating inputs: >= 256 MiB

struct Opts {
  std::string torch, md;
  double budget_ms = 3000;
  std::string only;
};

// One row of the table.
struct Row {
  Row(std::string k, std::string kern, std::string sh, std::string c = "")
      : key(std::move(k)), kernel(std::move(kern)), shape(std::move(sh)), check(std::move(c)) {}
  std::string key, kernel, shape, check;
  std::vector<double> ms;   // sorted
  double fmt_amount = 0;    // bytes (format) or FLOPs
  double moved_bytes = 0;   // bytes the kernel moves (0: not given)
  bool flops = false;
  double peak = kCopyGBs;   // GB/s or TFLOP/s
  std::string bar;          // the bar, in words
  double bar_frac = 0;      // bar as a fraction of peak (0: latency bar)
  double bar_us = 0;        // latency bar
};

int copies_for(std::size_t input_bytes) {
  if (input_bytes >= kRotate) return 1;
  return static_cast<int>(std::max<std::size_t>(2, (kRotate + input_bytes - 1) / input_bytes));
}

template <typename T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> v(n);
  gpu::copy_to_host(v.data(), p, n * sizeof(T));
  return v;
}

// Bits of a and b equal (floats compared as bits); returns "ok (n values)" or the first mismatch.
template <typename T>
std::string compare(const std::vector<T>& dev, const std::vector<T>& ref, const std::string& what) {
  if (dev.size() != ref.size()) return "FAIL " + what + ": sizes differ";
  bool all_zero = true;
  for (size_t i = 0; i < dev.size(); ++i) {
    if (std::memcmp(&dev[i], &ref[i], sizeof(T)) != 0) {
      std::ostringstream s;
      s << "FAIL " << what << ": first mismatch at " << i << " (" << +dev[i] << " vs ref " << +ref[i] << ")";
      return s.str();
    }
    if (dev[i] != T{}) all_zero = false;
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(dev[i])) return "FAIL " + what + ": NaN output";
    }
  }
  if (all_zero) return "FAIL " + what + ": all zero";
  return "ok (" + std::to_string(dev.size()) + " " + what + " bit-exact)";
}

// Runs the timing of one case and stores it in `row` unless the check failed.
void time_case(const Opts& o, Row& row, int copies, const std::function<void(int)>& launch) {
  const double t1 = once_ms([&] { launch(0); });
  const int reps = static_cast<int>(std::clamp(o.budget_ms / std::max(t1, 1e-3), 3.0, 50.0));
  const int warmup = t1 > 200 ? 0 : 3;
  row.ms = time_ms(warmup, reps, copies, launch);
}

// ---- the cases ----

// FP8 window-KV (kWindowKvFp8, 528 B/token) or FP4 main-KV (kCompressedKvFp4, 288 B/token) pack.
// bf16 == true: the production format, x in bf16 storage (gpu::pack_rows_bf16: moved bytes = format
// bytes); false: the backend's fp32 storage of the same values (gpu::pack_rows). The check covers
// the variant timed (its bytes and flags vs reference write_entries).
Row pack_case(const Opts& o, formats::CacheFormat f, int64_t T, const char* key, bool bf16 = true) {
  const int dim = 512, eb = formats::entry_bytes(f, dim);
  Row r{key, f == formats::CacheFormat::kWindowKvFp8 ? "FP8 window-KV quantize+pack" : "FP4 main-KV quantize+pack",
        "T " + std::to_string(T) + " x 512" + (bf16 ? " (bf16 storage)" : " (fp32 storage)")};
  const int copies = copies_for(static_cast<std::size_t>(T) * dim * (bf16 ? 2 : 4));
  DeviceBuffer<float> x(static_cast<size_t>(copies) * T * dim);
  DeviceBuffer<uint16_t> xb(bf16 ? x.size() : 1);
  DeviceBuffer<uint8_t> packed(static_cast<size_t>(T) * eb), finite(static_cast<size_t>(T));
  fill_bf16(x.get(), static_cast<int64_t>(x.size()), dim, 20261201u, -20, 20);
  if (bf16) gpu::to_bf16_storage(x.get(), static_cast<int64_t>(x.size()), xb.get());
  const auto run = [&](int c) {
    const size_t off = static_cast<size_t>(c) * T * dim;
    if (bf16) gpu::pack_rows_bf16(f, xb.get() + off, T, dim, packed.get(), finite.get());
    else gpu::pack_rows(f, x.get() + off, T, dim, packed.get(), finite.get());
  };
  time_case(o, r, copies, run);
  gpu::fill_device(packed.get(), 0xA5, packed.bytes());  // the check sees this launch's bytes only
  gpu::fill_device(finite.get(), 0, finite.bytes());
  run(0);
  gpu::synchronize();
  // Check: the first and last (up to) 16384 rows through reference_ops().write_entries.
  const int64_t R = std::min<int64_t>(T, 16384);
  std::string check;
  for (int64_t first : {int64_t{0}, T - R}) {
    Tensor<float> rows({R, dim}, download(x.get() + first * dim, static_cast<size_t>(R * dim)), "rows");
    Tensor<uint8_t> storage({R, eb}, "storage");
    std::vector<int64_t> entries(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) entries[static_cast<size_t>(i)] = i;
    reference::seam::reference_ops().write_entries(storage, f, entries, rows);
    check = compare(download(packed.get() + first * eb, static_cast<size_t>(R * eb)), storage.data(), "bytes");
    const std::vector<uint8_t> fl = download(finite.get() + first, static_cast<size_t>(R));
    if (std::count(fl.begin(), fl.end(), uint8_t{1}) != R) check = "FAIL finite flags";
    if (check.rfind("ok", 0) != 0) break;
    if (T == R) break;
  }
  r.check = check;
  r.fmt_amount = double(T) * (2.0 * dim + eb);
  r.moved_bytes = double(T) * ((bf16 ? 2.0 : 4.0) * dim + eb + 1);
  if (f == formats::CacheFormat::kWindowKvFp8) r.bar = ">= 85% of copy", r.bar_frac = 0.85;
  else r.bar = ">= 70% of copy", r.bar_frac = 0.70;
  return r;
}

// Indexer scores: q [T, 32, 128], keys [n, 128], w [T, 32] -> scores [T, n]; FLOPs 2*T*32*128*n.
// q and keys are FP4-QDQ values (qdq(kIndexKeysFp4, .), as the model feeds them; made once on the
// host and copied into every rotating copy), so cuda/indexer.cu takes its int8 tensor-core path; the
// check says which share of the pairs it took (index_scores_last_path).
Row indexer_case(const Opts& o, int64_t T, int64_t n, const char* key, const std::string& shape_note) {
  const int64_t H = 32, D = 128;
  Row r{key, "indexer scores", "T " + std::to_string(T) + " x " + std::to_string(n) + " keys x 32 x 128" + shape_note};
  const int copies = copies_for(static_cast<std::size_t>((T * H * D + n * D) * 4));
  DeviceBuffer<float> q(static_cast<size_t>(copies * T * H * D)), keys(static_cast<size_t>(copies * n * D)),
      w(static_cast<size_t>(T * H)), scores(static_cast<size_t>(T * n));
  DeviceBuffer<int64_t> reach(static_cast<size_t>(T));
  const auto fill_qdq = [&](float* x, int64_t rows, uint64_t seed) {  // copy 0: bf16 -> FP4 QDQ, then the others
    fill_bf16(x, rows * D, D, seed, -1, 1);
    const Tensor<float> v({rows, D}, download(x, static_cast<size_t>(rows * D)), "x");
    const Tensor<float> v_qdq = reference::seam::reference_ops().qdq(formats::CacheFormat::kIndexKeysFp4, v);
    for (int c = 0; c < copies; ++c) {
      gpu::copy_to_device(x + c * rows * D, v_qdq.data().data(), v_qdq.data().size() * 4);
    }
  };
  fill_qdq(q.get(), T * H, 11u);
  fill_qdq(keys.get(), n, 12u);
  fill_bf16(w.get(), static_cast<int64_t>(w.size()), H, 13u, -4, -2);
  fill_i64_const(reach.get(), T, n);
  time_case(o, r, copies, [&](int c) {
    gpu::index_scores(q.get() + c * T * H * D, keys.get() + c * n * D, w.get(), reach.get(), T, H, D, n,
                      scores.get());
  });
  gpu::index_scores(q.get(), keys.get(), w.get(), reach.get(), T, H, D, n, scores.get());
  const gpu::IndexScoresPath path = gpu::index_scores_last_path();
  // CPU check: the first and the last R rows (R x n x 32 x 128 double products each).
  const int64_t R = std::min<int64_t>(T, 4);
  Tensor<float> hk({n, D}, download(keys.get(), static_cast<size_t>(n * D)), "keys");
  for (int64_t first : {int64_t{0}, T - R}) {
    Tensor<float> hq({R, H, D}, download(q.get() + first * H * D, static_cast<size_t>(R * H * D)), "q");
    Tensor<float> hw({R, H}, download(w.get() + first * H, static_cast<size_t>(R * H)), "w");
    const Tensor<float> ref =
        reference::index_scores(hq, hk, hw, std::vector<int64_t>(static_cast<size_t>(R), n));
    r.check = compare(download(scores.get() + first * n, static_cast<size_t>(R * n)), ref.data(),
                      first == 0 ? "scores of the first rows" : "scores of the first and last rows");
    if (r.check.rfind("ok", 0) != 0 || T == R) break;
  }
  r.check += path.mma ? "; int8 mma path, exact fallback for " + std::to_string(path.slow_queries) + "/" +
                            std::to_string(T) + " queries, " + std::to_string(path.slow_keys) + "/" +
                            std::to_string(n) + " keys"
                      : "; exact (double) path only";
  r.flops = true;
  r.fmt_amount = 2.0 * double(T) * H * D * double(n);
  r.moved_bytes = 4.0 * double(T * H * D + n * D + T * H + T * n);
  r.peak = kFp8TF;
  r.bar = ">= 35% of fp8 peak", r.bar_frac = 0.35;
  return r;
}

// Top-k and candidate pool cases (cuda/topk.cu), rows x n bf16 scores in (-2, 2) (many ties), every
// row reaching n:
//   kTopk         index_topk_async (select_index_topk), k 512; `chunk` forces the first level (0 auto)
//   kPool         candidate_blocks (select_candidate_blocks' mask: max of 8, top-2048 blocks)
//   kMaskedTopk   index_topk_async with the candidate mask of the row fused (apply_candidate_mask +
//                 top-512, the later indexer layers)
//   kPoolTopk     candidate_pool_topk: the candidate source's mask and its own top-512 (one kernel
//                 for n <= 16384)
//   kPoolTopkSplit the same outputs through candidate_blocks + index_topk_async (two launchers)
// The NaN flag is read once after timing (no synchronization inside a timed launch). The check
// covers the first (up to) 16 rows.
enum class TopkKind { kTopk, kPool, kMaskedTopk, kPoolTopk, kPoolTopkSplit };

Row topk_case(const Opts& o, int64_t rows, int64_t n, TopkKind kind, const char* key, int64_t chunk = 0) {
  const bool topk = kind != TopkKind::kPool;
  const bool mask_out = kind == TopkKind::kPool || kind == TopkKind::kPoolTopk || kind == TopkKind::kPoolTopkSplit;
  const char* kernel = kind == TopkKind::kTopk         ? "top-512 (index_topk)"
                       : kind == TopkKind::kPool       ? "candidate pool (max of 8, top-2048 blocks)"
                       : kind == TopkKind::kMaskedTopk ? "top-512 of masked scores (mask fused)"
                       : kind == TopkKind::kPoolTopk   ? "candidate pool + top-512, fused"
                                                       : "candidate pool + top-512, two launchers";
  const std::string note = chunk ? " (chunk " + std::to_string(chunk) + ")" : "";
  Row r{key, kernel, std::to_string(rows) + " rows x " + std::to_string(n) + note};
  const int copies = copies_for(static_cast<std::size_t>(rows * n * 4));
  DeviceBuffer<float> s(static_cast<size_t>(copies * rows * n));
  DeviceBuffer<int64_t> reach(static_cast<size_t>(rows));
  DeviceBuffer<int32_t> idx(static_cast<size_t>(rows * 512));
  DeviceBuffer<uint8_t> mask(static_cast<size_t>(rows * n));
  DeviceBuffer<uint8_t> in_mask(kind == TopkKind::kMaskedTopk ? static_cast<size_t>(rows * n) : 1);
  DeviceBuffer<int> nan(1);
  fill_bf16(s.get(), static_cast<int64_t>(s.size()), n, 21u, 0, 1);  // bf16 in (-2, 2): many ties
  fill_i64_const(reach.get(), rows, n);
  nan.poison(0);
  if (kind == TopkKind::kMaskedTopk) gpu::candidate_blocks(s.get(), reach.get(), rows, n, 2048, 8, in_mask.get());
  const auto run = [&](int c) {
    const float* in = s.get() + static_cast<size_t>(c) * rows * n;
    switch (kind) {
      case TopkKind::kTopk:
        gpu::index_topk_async(in, nullptr, reach.get(), rows, n, 512, idx.get(), nan.get(), chunk);
        break;
      case TopkKind::kPool: gpu::candidate_blocks(in, reach.get(), rows, n, 2048, 8, mask.get()); break;
      case TopkKind::kMaskedTopk:
        gpu::index_topk_async(in, in_mask.get(), reach.get(), rows, n, 512, idx.get(), nan.get(), chunk);
        break;
      case TopkKind::kPoolTopk:
        gpu::candidate_pool_topk(in, reach.get(), rows, n, 512, 2048, 8, mask.get(), idx.get(), nan.get());
        break;
      case TopkKind::kPoolTopkSplit:
        gpu::candidate_blocks(in, reach.get(), rows, n, 2048, 8, mask.get());
        gpu::index_topk_async(in, nullptr, reach.get(), rows, n, 512, idx.get(), nan.get(), chunk);
        break;
    }
  };
  time_case(o, r, copies, run);
  run(0);
  gpu::synchronize();
  const int64_t R = std::min<int64_t>(rows, 16);
  Tensor<float> hs({R, n}, download(s.get(), static_cast<size_t>(R * n)), "scores");
  const std::vector<int64_t> hreach(static_cast<size_t>(R), n);
  std::string check;
  if (mask_out) {
    const auto ref = reference::select_candidate_blocks(hs, hreach, 2048, 8, 0);
    check = compare(download(mask.get(), static_cast<size_t>(R * n)), ref.mask.data(), "mask values");
  }
  if (topk && (check.empty() || check.rfind("ok", 0) == 0)) {
    if (kind == TopkKind::kMaskedTopk) {
      const Tensor<uint8_t> m({R, n}, download(in_mask.get(), static_cast<size_t>(R * n)), "candidates");
      reference::apply_candidate_mask(hs, {0, m}, 0);
    }
    const auto ref = reference::select_index_topk(hs, hreach, 512, 0, 0, 4);
    const std::string c = compare(download(idx.get(), static_cast<size_t>(R * 512)), ref.idxs.data(), "indices");
    check = check.empty() || c.rfind("ok", 0) != 0 ? c : check + " + " + c;
  }
  if (download(nan.get(), 1)[0] != 0) check = "FAIL NaN reported";
  r.check = check;
  r.fmt_amount = 4.0 * double(rows * n) + (mask_out ? double(rows * n) : 0.0) + (topk ? 4.0 * rows * 512 : 0.0) +
                 (kind == TopkKind::kMaskedTopk ? double(rows * n) : 0.0);
  r.moved_bytes = r.fmt_amount;
  if (rows == 64 && n == 16384 && topk) r.bar = "<= 15 us (compass: 6 us, pool fused)", r.bar_us = 15;
  else r.bar = "—";
  return r;
}

// Sparse attention, h 64, d 512, k 640 (128 window + 512 compressed indices), the three bit-exact
// stages of CudaOps::sparse_attn (scores, online softmax, P.V). Decode (B > 0): B sequences x s_q 4
// query rows; each sequence owns 128 window rows + 2048 compressed rows of kv; query i of a
// sequence reads the window and the compressed rows j*4 + i (distinct across its 4 queries).
// Prefill (B = 0): one sequence of T = 4096 queries over 4096 window rows + 1024 compressed rows;
// query t reads the window rows max(0, t-127) .. t (-1 past t: the prefill window_topk_idxs rows)
// and 512 distinct compressed rows (t*37 + 2j) % 1024. Checked: 2 query rows at each end.
Row attention_case(const Opts& o, int64_t B, const char* key) {
  const bool prefill = B == 0;
  const int64_t sq = 4, H = 64, D = 512, K = 640, W = 128, C = prefill ? 1024 : 2048;
  const int64_t T = prefill ? 4096 : B * sq, N = prefill ? T + C : B * (W + C);
  Row r{key, prefill ? "sparse attention prefill" : "sparse attention decode",
        prefill ? "T 4096 h 64 k 640 d 512" : "B " + std::to_string(B) + " s_q 4 h 64 k 640 d 512"};
  DeviceBuffer<float> q(static_cast<size_t>(T * H * D)), kv(static_cast<size_t>(N * D)), sink(H),
      s(static_cast<size_t>(T * H * K)), p(s.size()), rescale(static_cast<size_t>(T * H * (K / 64))),
      l(static_cast<size_t>(T * H)), out(static_cast<size_t>(T * H * D));
  fill_bf16(q.get(), static_cast<int64_t>(q.size()), D, 31u, 0, 1);
  fill_bf16(kv.get(), static_cast<int64_t>(kv.size()), D, 32u, -1, 0);
  fill_f32(sink.get(), H, 33u, -1.0f, 2.0f);
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
  const auto run = [&](int) {
    gpu::sparse_attn_scores(q.get(), kv.get(), idxs.get(), T, H, D, K, scale, s.get());
    gpu::sparse_attn_softmax(s.get(), sink.get(), T, H, K, p.get(), rescale.get(), l.get());
    gpu::sparse_attn_pv(kv.get(), idxs.get(), p.get(), rescale.get(), l.get(), T, H, D, K, out.get());
  };
  time_case(o, r, 1, run);
  run(0);
  gpu::synchronize();
  // CPU: the rows {0, 1, T-2, T-1} (T >= 4) x 64 heads x 640 x 512 x 2 through reference::sparse_attn.
  const std::vector<int64_t> check_rows = T >= 4 ? std::vector<int64_t>{0, 1, T - 2, T - 1} : std::vector<int64_t>{0};
  const int64_t R = static_cast<int64_t>(check_rows.size());
  Tensor<float> hq({R, H, D}, "q");
  Tensor<int32_t> hi({R, K}, "idxs");
  std::vector<float> got;
  for (int64_t k = 0; k < R; ++k) {
    const int64_t t = check_rows[static_cast<size_t>(k)];
    const std::vector<float> qt = download(q.get() + t * H * D, static_cast<size_t>(H * D));
    std::copy(qt.begin(), qt.end(), hq.row(k, 0));
    std::copy(hidx.begin() + t * K, hidx.begin() + (t + 1) * K, hi.row(k));
    const std::vector<float> ot = download(out.get() + t * H * D, static_cast<size_t>(H * D));
    got.insert(got.end(), ot.begin(), ot.end());
  }
  Tensor<float> hkv({N, D}, download(kv.get(), static_cast<size_t>(N * D)), "kv");
  const Tensor<float> ref = reference::sparse_attn(hq, hkv, download(sink.get(), H), hi, scale);
  r.check = compare(got, ref.data(), "outputs of rows 0, 1, T-2, T-1");
  if (!gpu::libm_expf_matches_host()) r.check += " (note: host std::exp is not libm_expf's)";
  r.flops = true;
  r.fmt_amount = 2.0 * double(T) * H * K * (512 + 512);
  // scores: q, the gathered rows once per CTA (64 heads), s; softmax: s, p; P.V: p, the gathered
  // rows once (128 channels per CTA), out; plus the index rows twice.
  r.moved_bytes = 4.0 * (double(T) * H * D * 2 + 2.0 * T * K * D + 4.0 * T * H * K) + 8.0 * T * K;
  r.peak = kBf16TF;
  if (prefill) r.bar = ">= 45% of bf16 peak", r.bar_frac = 0.45;
  else r.bar = ">= 30% of bf16 peak", r.bar_frac = 0.30;
  return r;
}

// mHC post, 4 streams: f [T, C], residual [T, 4, C], post [T, 4], comb [T, 4, 4] -> y [T, 4, C].
// bf16 == true: f, residual and y in bf16 storage (gpu::hc_post_bf16, the production format);
// false: fp32 storage (gpu::hc_post). The check covers the variant timed.
Row mhc_case(const Opts& o, int64_t T, const char* key, bool bf16 = true) {
  const int64_t hc = 4, C = 5120;
  Row r{key, "mHC post, 4 streams",
        "T " + std::to_string(T) + " C 5120" + (bf16 ? " (bf16 storage)" : " (fp32 storage)")};
  const int copies = copies_for(static_cast<std::size_t>(T * C * 5 * (bf16 ? 2 : 4)));
  DeviceBuffer<float> f(static_cast<size_t>(copies * T * C)), res(static_cast<size_t>(copies * T * hc * C)),
      post(static_cast<size_t>(T * hc)), comb(static_cast<size_t>(T * hc * hc)), y(static_cast<size_t>(T * hc * C));
  DeviceBuffer<uint16_t> fb(bf16 ? f.size() : 1), resb(bf16 ? res.size() : 1), yb(bf16 ? y.size() : 1);
  fill_bf16(f.get(), static_cast<int64_t>(f.size()), C, 41u, -2, 2);
  fill_bf16(res.get(), static_cast<int64_t>(res.size()), C, 42u, -2, 2);
  fill_f32(post.get(), T * hc, 43u, 0.0f, 2.0f);
  fill_f32(comb.get(), T * hc * hc, 44u, 0.0f, 1.0f);
  if (bf16) {
    gpu::to_bf16_storage(f.get(), static_cast<int64_t>(f.size()), fb.get());
    gpu::to_bf16_storage(res.get(), static_cast<int64_t>(res.size()), resb.get());
  }
  const auto run = [&](int c) {
    if (bf16) {
      gpu::hc_post_bf16(fb.get() + c * T * C, resb.get() + c * T * hc * C, post.get(), comb.get(), T, hc, C, yb.get());
    } else {
      gpu::hc_post(f.get() + c * T * C, res.get() + c * T * hc * C, post.get(), comb.get(), T, hc, C, y.get());
    }
  };
  time_case(o, r, copies, run);
  if (bf16) gpu::fill_device(yb.get(), 0xA5, yb.bytes());
  else gpu::fill_device(y.get(), 0xA5, y.bytes());
  run(0);
  gpu::synchronize();
  const int64_t R = std::min<int64_t>(T, 64);
  const Tensor<float> ref = reference::hc_post(
      Tensor<float>({R, C}, download(f.get(), static_cast<size_t>(R * C)), "f"),
      Tensor<float>({R, hc, C}, download(res.get(), static_cast<size_t>(R * hc * C)), "residual"),
      Tensor<float>({R, hc}, download(post.get(), static_cast<size_t>(R * hc)), "post"),
      Tensor<float>({R, hc, hc}, download(comb.get(), static_cast<size_t>(R * hc * hc)), "comb"));
  std::vector<float> got;
  if (bf16) {  // bf16 bits -> their fp32 values (exact)
    for (uint16_t b : download(yb.get(), static_cast<size_t>(R * hc * C))) {
      got.push_back(f32_from_bits(uint32_t{b} << 16));
    }
  } else {
    got = download(y.get(), static_cast<size_t>(R * hc * C));
  }
  r.check = compare(got, ref.data(), "outputs of the first tokens");
  r.fmt_amount = double(T) * C * 18;  // bf16: read f + 4 streams, write 4 streams
  r.moved_bytes = double(T) * (C * (bf16 ? 18 : 36) + 80);
  r.bar = ">= 70% of copy", r.bar_frac = 0.70;
  return r;
}

// Engram gather: ids [T, 24] into a table of `rows` rows of 256 E4M3 + 8 E8M0 -> [T, 24 * 256] bf16.
// bf16 == true: the output in bf16 storage (gpu::engram_lookup_bf16, the production format); false:
// fp32 storage (gpu::engram_lookup). The check covers the variant timed.
Row engram_case(const Opts& o, int64_t T, int64_t rows, const char* key, bool bf16 = true) {
  const int64_t cols = 24, hd = 256;
  Row r{key, "Engram gather", "T " + std::to_string(T) + ", 24 x 264 B rows, table " +
                                  std::to_string(rows * (hd + hd / 32) >> 30) + " GiB" +
                                  (bf16 ? " (bf16 out)" : " (fp32 out)")};
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows * hd)), scales(static_cast<size_t>(rows * hd / 32));
  DeviceBuffer<int64_t> ids(static_cast<size_t>(T * cols));
  DeviceBuffer<float> out(bf16 ? 1 : static_cast<size_t>(T * cols * hd));
  DeviceBuffer<uint16_t> outb(bf16 ? static_cast<size_t>(T * cols * hd) : 1);
  fill_u8(codes.get(), static_cast<int64_t>(codes.size()), 51u, 0, 255, true);
  fill_u8(scales.get(), static_cast<int64_t>(scales.size()), 52u, 117, 137, false);
  fill_i64(ids.get(), T * cols, 53u, rows);
  const auto run = [&](int) {
    if (bf16) gpu::engram_lookup_bf16(codes.get(), scales.get(), hd, ids.get(), T, cols, outb.get());
    else gpu::engram_lookup(codes.get(), scales.get(), hd, ids.get(), T, cols, out.get());
  };
  time_case(o, r, 1, run);
  if (bf16) gpu::fill_device(outb.get(), 0xA5, outb.bytes());
  else gpu::fill_device(out.get(), 0xA5, out.bytes());
  run(0);
  gpu::synchronize();
  // Check the first R tokens: their rows copied into a compact table, ids renumbered.
  const int64_t R = std::min<int64_t>(T, 64);
  const std::vector<int64_t> hid = download(ids.get(), static_cast<size_t>(R * cols));
  std::vector<uint8_t> tc(static_cast<size_t>(R * cols * hd)), ts(static_cast<size_t>(R * cols * hd / 32));
  std::vector<int64_t> local(hid.size());
  for (size_t i = 0; i < hid.size(); ++i) {
    gpu::copy_to_host(tc.data() + i * hd, codes.get() + hid[i] * hd, hd);
    gpu::copy_to_host(ts.data() + i * hd / 32, scales.get() + hid[i] * hd / 32, hd / 32);
    local[i] = static_cast<int64_t>(i);
  }
  const Tensor<float> ref = reference::engram_lookup(reference::engram_table(tc, ts, R * cols, static_cast<int>(hd)),
                                                     Tensor<int64_t>({R, cols}, local, "ids"));
  std::vector<float> got;
  if (bf16) {  // bf16 bits -> their fp32 values (exact)
    for (uint16_t b : download(outb.get(), static_cast<size_t>(R * cols * hd))) {
      got.push_back(f32_from_bits(uint32_t{b} << 16));
    }
  } else {
    got = download(out.get(), static_cast<size_t>(R * cols * hd));
  }
  r.check = compare(got, ref.data(), "outputs of the first tokens");
  r.fmt_amount = double(T) * cols * (264 + 2 * hd + 8);
  r.moved_bytes = double(T) * cols * (264 + (bf16 ? 2 : 4) * hd + 8);
  r.bar = ">= 70% of copy", r.bar_frac = 0.70;
  return r;
}

// ---- output ----

std::map<std::string, std::pair<double, double>> read_torch(const std::string& path) {
  std::map<std::string, std::pair<double, double>> m;
  std::ifstream in(path);
  std::string key;
  double us = 0, amount = 0;
  while (in >> key >> us >> amount) m[key] = {us, amount};
  return m;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string table(const std::vector<Row>& rows, const std::map<std::string, std::pair<double, double>>& torch) {
  std::ostringstream s;
  s << "| kernel | shape | check vs reference | min / median / p90 µs | achieved (fmt) | moved GB/s | % of H200 "
       "limit | bar | meets? | torch eager µs | speed-up |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const bool ok = r.check.rfind("ok", 0) == 0 && !r.ms.empty();
    s << "| " << r.kernel << " | " << r.shape << " | " << r.check << " | ";
    if (!ok) {
      s << "— | — | — | — | " << r.bar << " | not timed (check failed) | — | — |\n";
      continue;
    }
    const double med = r.ms[r.ms.size() / 2], us = med * 1e3;
    const double rate = r.fmt_amount / (med * 1e-3) / (r.flops ? 1e12 : 1e9);
    const double frac = rate / r.peak;
    s << fmt("%.1f", r.ms.front() * 1e3) << " / " << fmt("%.1f", us) << " / "
      << fmt("%.1f", r.ms[std::min(r.ms.size() - 1, r.ms.size() * 9 / 10)] * 1e3) << " (n " << r.ms.size() << ") | "
      << fmt(r.flops ? "%.2f TFLOP/s" : "%.0f GB/s", rate) << " | "
      << (r.moved_bytes > 0 ? fmt("%.0f", r.moved_bytes / (med * 1e-3) / 1e9) : "—") << " | "
      << fmt("%.1f%%", 100 * frac) << " of " << fmt(r.flops ? "%.0f TF" : "%.0f GB/s", r.peak) << " | " << r.bar
      << " | ";
    if (r.bar_frac > 0) s << (frac >= r.bar_frac ? "MEETS" : "MISSES");
    else if (r.bar_us > 0) s << (us <= r.bar_us ? "MEETS" : "MISSES");
    else s << "—";
    const auto t = torch.find(r.key);
    if (t == torch.end() || t->second.first <= 0) {
      s << " | — | — |\n";
    } else {  // speed-up on rates: the shapes may differ (the table says which)
      const double torch_rate = t->second.second / t->second.first, our_rate = r.fmt_amount / us;
      s << " | " << fmt("%.1f", t->second.first) << " | " << fmt("%.2fx", our_rate / torch_rate) << " |\n";
    }
  }
  return s.str();
}

int run(const Opts& o) {
  if (gpu::device_count() == 0) {
    std::printf("no CUDA device: nothing timed\n");
    return 0;
  }
  std::printf("device: %s, CUDA runtime %s\n", gpu::device_name(0).c_str(), cuda_runtime_version().c_str());
  std::vector<Row> rows;
  int failed = 0;
  const auto add = [&](const std::string& name, const std::function<Row()>& make) {
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      rows.push_back(make());
    } catch (const std::exception& e) {
      Row r{name, name, "—", std::string("FAIL error: ") + e.what()};
      rows.push_back(r);
    }
    if (rows.back().check.rfind("ok", 0) != 0) ++failed;
    const Row& r = rows.back();
    std::printf("%-12s %-40s median %10.1f us  %s  (%.1f s)\n", r.key.c_str(), r.shape.c_str(),
                r.ms.empty() ? 0.0 : r.ms[r.ms.size() / 2] * 1e3, r.check.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  };
  using CF = formats::CacheFormat;
  add("fp8_pack_2M", [&] { return pack_case(o, CF::kWindowKvFp8, int64_t{1} << 21, "fp8_pack_2M"); });
  add("fp8_pack_64", [&] { return pack_case(o, CF::kWindowKvFp8, 64, "fp8_pack_64"); });
  add("fp4_pack_2M", [&] { return pack_case(o, CF::kCompressedKvFp4, int64_t{1} << 21, "fp4_pack_2M"); });
  add("fp4_pack_64", [&] { return pack_case(o, CF::kCompressedKvFp4, 64, "fp4_pack_64"); });
  add("fp8_pack_2M_f32", [&] { return pack_case(o, CF::kWindowKvFp8, int64_t{1} << 21, "fp8_pack_2M_f32", false); });
  add("fp4_pack_2M_f32",
      [&] { return pack_case(o, CF::kCompressedKvFp4, int64_t{1} << 21, "fp4_pack_2M_f32", false); });
  // Indexer: the decode shape first (64 queries), then the prefill shape (4096 queries), cut to what
  // runs in about a second per launch only if the decode case shows a slow kernel (the exact fp64
  // fallback taking every pair): the table then says the T used.
  double idx64_ms = 0;
  add("idx_decode", [&] {
    Row r = indexer_case(o, 64, 16384, "idx_decode", " (decode: 16 seq x s_q 4)");
    if (!r.ms.empty()) idx64_ms = r.ms[r.ms.size() / 2];
    return r;
  });
  add("idx_prefill", [&] {
    int64_t T = 4096;
    if (idx64_ms > 0) T = std::clamp<int64_t>(static_cast<int64_t>(1000.0 / idx64_ms) * 64, 64, 4096);
    return indexer_case(o, T, 16384, "idx_prefill", T < 4096 ? " (of the 4096 of the issue)" : "");
  });
  using TK = TopkKind;
  add("topk_decode", [&] { return topk_case(o, 64, 16384, TK::kTopk, "topk_decode"); });
  add("topk_decode_c8192", [&] { return topk_case(o, 64, 16384, TK::kTopk, "topk_decode_c8192", 8192); });
  add("topk_decode_c4096", [&] { return topk_case(o, 64, 16384, TK::kTopk, "topk_decode_c4096", 4096); });
  add("topk_masked_decode", [&] { return topk_case(o, 64, 16384, TK::kMaskedTopk, "topk_masked_decode"); });
  add("pool_topk_decode", [&] { return topk_case(o, 64, 16384, TK::kPoolTopk, "pool_topk_decode"); });
  add("pool_topk_split_decode", [&] { return topk_case(o, 64, 16384, TK::kPoolTopkSplit, "pool_topk_split_decode"); });
  add("pool_decode", [&] { return topk_case(o, 64, 262144, TK::kPool, "pool_decode"); });
  add("topk_long", [&] { return topk_case(o, 4, 524288, TK::kTopk, "topk_long"); });
  add("topk_rows_long", [&] { return topk_case(o, 256, 131072, TK::kTopk, "topk_rows_long"); });
  add("attn_decode", [&] { return attention_case(o, 64, "attn_decode"); });
  add("attn_b1", [&] { return attention_case(o, 1, "attn_b1"); });
  add("attn_prefill", [&] { return attention_case(o, 0, "attn_prefill"); });
  add("mhc_8192", [&] { return mhc_case(o, 8192, "mhc_8192"); });
  add("mhc_64", [&] { return mhc_case(o, 64, "mhc_64"); });
  add("mhc_8192_f32", [&] { return mhc_case(o, 8192, "mhc_8192_f32", false); });
  const int64_t table_rows = int64_t{48} << 20;  // 48 Mi rows x 264 B = 12.4 GiB >> L2
  add("engram_65536", [&] { return engram_case(o, 65536, table_rows, "engram_65536"); });
  add("engram_64", [&] { return engram_case(o, 64, table_rows, "engram_64"); });
  add("engram_65536_f32", [&] { return engram_case(o, 65536, table_rows, "engram_65536_f32", false); });

  const std::string md = table(rows, read_torch(o.torch));
  std::printf("\n%s", md.c_str());
  if (!o.md.empty()) {
    std::ofstream f(o.md);
    f << md;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dsv41::bench

int main(int argc, char** argv) {
  dsv41::bench::Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--torch" && has) o.torch = argv[++i];
    else if (a == "--md" && has) o.md = argv[++i];
    else if (a == "--budget-ms" && has) o.budget_ms = std::atof(argv[++i]);
    else if (a == "--only" && has) o.only = argv[++i];
    else {
      std::fprintf(stderr, "usage: dsv41_kernels_bench [--torch FILE] [--md FILE] [--budget-ms MS] [--only NAME]\n");
      return 2;
    }
  }
  try {
    return dsv41::bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
