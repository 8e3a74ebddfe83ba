// cuda/cuda_ops_indexer.cc
//
// CudaOps::index_weights and CudaOps::index_scores (cuda/indexer.cu kernels), candidate_blocks,
// mask_scores and index_topk (cuda/topk.cu kernels): BIT-EXACT, docs/cuda.md. The keys of
// index_scores are the index-key cache entries 0 .. count - 1, unpacked on the device
// (CudaOps::read_entries, bit-exact) as the reference's read_all_entries does. Inputs the
// reference rejects (bad shapes, a reach outside [0, N], a NaN score for the top-k) run the
// reference on host copies, which raises its own error (a host call).
// index_select: in kProduction with "indexer" on, the fused production kernel (cuda/index_select.h,
// ORDER-VARIANT: the head sum's order) where it covers the inputs (any N up to the merge's limit:
// ranges of 65536 keys and a merge past that, still no [T, N] scores); else the seam's default
// composition of the ops above (bit-exact).
#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/index_select.h"
#include "cuda/kernels.h"
#include "formats/cache_format.h"
#include "reference/ops/indexer.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {
const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }
}  // namespace

Tensor<float> CudaOps::index_weights(const Tensor<float>& proj, int index_head_dim) const {
  if (!(proj.rank() == 2 && proj.dim(1) > 0 && index_head_dim > 0)) {  // the reference raises its error
    count("index_weights", false);
    return upload(ref().index_weights(host_copy(proj), index_head_dim));
  }
  count("index_weights", true);
  const float scale = reference::index_weight_scale(index_head_dim, static_cast<int>(proj.dim(1)));
  DevIn<float> p(proj);
  Tensor<float> w = device_tensor<float>(proj.shape(), "index_weights");
  gpu::index_weights(p.get(), proj.numel(), scale, dev(w));
  return w;
}

Tensor<float> CudaOps::index_scores(const Tensor<float>& q, const reference::CacheRows& keys,
                                    const Tensor<float>& weights, const std::vector<int64_t>& reach) const {
  const auto host = [&] {
    count("index_scores", false);
    const Tensor<uint8_t> bytes = keys.bytes ? host_copy(*keys.bytes) : Tensor<uint8_t>();
    reference::CacheRows k = keys;
    k.bytes = keys.bytes ? &bytes : nullptr;
    return upload(ref().index_scores(host_copy(q), k, host_copy(weights), reach));
  };
  if (!(q.rank() == 3 && weights.rank() == 2 && keys.count >= 0)) return host();
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2), n = keys.count;
  bool ok = keys.dim == d && weights.dim(0) == T && weights.dim(1) == heads &&
            static_cast<int64_t>(reach.size()) == T;
  for (int64_t r : reach) ok = ok && r >= 0 && r <= n;
  if (!ok) return host();
  count("index_scores", true);
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  const Tensor<float> rows = read_entries(keys, all);  // [n, d] on the device (read_all_entries)
  Tensor<float> scores = device_tensor<float>({T, n}, "index_score");
  if (T * n == 0) return scores;
  DevIn<float> dq(q), dk(rows), dw(weights);
  const auto dr = to_device(reach);
  gpu::index_scores(dq.get(), dk.get(), dw.get(), dr->get(), T, heads, d, n, dev(scores));
  return scores;
}

namespace {

// The reference's check_reach: one value per row, each in [0, n].
bool reach_ok(const std::vector<int64_t>& reach, int64_t rows, int64_t n) {
  if (static_cast<int64_t>(reach.size()) != rows) return false;
  for (int64_t r : reach) {
    if (r < 0 || r > n) return false;
  }
  return true;
}

}  // namespace

Tensor<uint8_t> CudaOps::candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                          int topk_blocks, int block_size) const {
  const bool ok = topk_blocks > 0 && block_size > 0 && scores.rank() == 2 &&
                  reach_ok(reach, scores.dim(0), scores.dim(1));
  if (!ok) {  // the reference raises its error
    count("candidate_blocks", false);
    return upload(ref().candidate_blocks(host_copy(scores), reach, topk_blocks, block_size));
  }
  count("candidate_blocks", true);
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  Tensor<uint8_t> mask = device_tensor<uint8_t>({rows, n}, "candidates");
  if (rows * n == 0) return mask;
  DevIn<float> s(scores);
  const auto dr = to_device(reach);
  gpu::candidate_blocks(s.get(), dr->get(), rows, n, topk_blocks, block_size, dev(mask));
  return mask;
}

void CudaOps::mask_scores(Tensor<float>& scores, const Tensor<uint8_t>& mask) const {
  if (!(mask.shape() == scores.shape() && !scores.on_host())) {  // the reference's error, or a host tensor
    count("mask_scores", false);
    Tensor<float> h = host_copy(scores);
    ref().mask_scores(h, host_copy(mask));
    scores = scores.on_host() ? std::move(h) : upload(std::move(h));
    return;
  }
  count("mask_scores", true);
  DevIn<uint8_t> m(mask);
  gpu::mask_scores(dev(scores), m.get(), scores.numel());
}

Tensor<int32_t> CudaOps::index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach, int k) const {
  const auto host = [&] {  // the reference raises its error
    count("index_topk", false);
    return upload(ref().index_topk(host_copy(scores), reach, k));
  };
  if (!(scores.rank() == 2 && k > 0)) return host();
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  if (!reach_ok(reach, rows, n) || (rows > 0 && reach.back() != n)) return host();
  const int64_t kk = std::min<int64_t>(k, n);
  time_mark("index_topk");  // counted below, once it is known whether it ran as kernels
  Tensor<int32_t> out = device_tensor<int32_t>({rows, kk}, "indexer_topk");
  if (rows * kk > 0) {
    DevIn<float> s(scores);
    const auto dr = to_device(reach);
    int* check = deferred_check(
        [&] { return detail::concat("index_topk of '", scores.name(), "': a score is NaN"); });
    if (check != nullptr) {
      gpu::index_topk_async(s.get(), nullptr, dr->get(), rows, n, kk, dev(out), check);
    } else if (!gpu::index_topk(s.get(), dr->get(), rows, n, kk, dev(out))) {
      return host();  // a NaN score: the reference raises its error
    }
  }
  count("index_topk", true);
  return out;
}

reference::IndexSelection CudaOps::index_select(const Tensor<float>& q, const reference::CacheRows& keys,
                                                const Tensor<float>& weights, const std::vector<int64_t>& reach,
                                                const reference::IndexSelectSpec& spec) const {
  const auto composed = [&] { return Ops::index_select(q, keys, weights, reach, spec); };
  if (!production("indexer")) return composed();
  // What the kernel covers; anything else (and every input the reference rejects) is composed.
  const bool source = spec.candidate_topk_blocks > 0;
  if (!(q.rank() == 3 && weights.rank() == 2 && keys.format == formats::CacheFormat::kIndexKeysFp4 &&
        keys.bytes != nullptr && !keys.bytes->on_host() && spec.index_topk > 0 && !(source && spec.pool != nullptr))) {
    return composed();
  }
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2), n = keys.count;
  const int64_t k = std::min<int64_t>(spec.index_topk, n);
  if (!(T > 0 && keys.dim == d && weights.dim(0) == T && weights.dim(1) == heads && reach_ok(reach, T, n) &&
        reach.back() == n && index_select_fits(heads, d, n, k, spec.candidate_topk_blocks, spec.candidate_block_size) &&
        keys.bytes->rank() == 2 && keys.bytes->dim(0) >= n &&
        keys.bytes->dim(1) == formats::entry_bytes(keys.format, static_cast<int>(d)) &&
        (spec.pool == nullptr || spec.pool->shape() == std::vector<int64_t>{T, n}))) {
    return composed();
  }
  time_mark("index_select");  // counted below, once it is known whether the kernel's result stands
  reference::IndexSelection out;
  out.topk = device_tensor<int32_t>({T, k}, "indexer_topk");
  if (source) out.candidates = device_tensor<uint8_t>({T, n}, "candidates");
  DevIn<float> dq(q), dw(weights);
  std::unique_ptr<DevIn<uint8_t>> pool;
  if (spec.pool != nullptr) pool = std::make_unique<DevIn<uint8_t>>(*spec.pool);
  const auto dr = to_device(reach);
  IndexSelectArgs a;
  a.q = dq.get();
  a.w = dw.get();
  a.keys = dev(*keys.bytes);
  a.reach = dr->get();
  a.pool = pool ? pool->get() : nullptr;
  a.T = T, a.heads = heads, a.dim = d, a.n = n, a.k = k;
  a.topk_blocks = source ? spec.candidate_topk_blocks : 0;
  a.block_size = source ? spec.candidate_block_size : 0;
  a.topk = dev(out.topk);
  a.mask = source ? dev(out.candidates) : nullptr;
  Tensor<uint8_t> workspace = device_tensor<uint8_t>({index_select_workspace_bytes(a)}, "index_select_workspace");
  a.workspace = dev(workspace);
  gpu::index_select(a);
  if (index_select_flagged(dev(workspace))) {  // an input the int8 codes cannot hold exactly
    count("index_select (composed: not encodable)", true);
    return composed();
  }
  count("index_select", true);
  return out;
}

}  // namespace dsv41::gpu
