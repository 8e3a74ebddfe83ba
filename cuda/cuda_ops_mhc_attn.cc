// cuda/cuda_ops_mhc_attn.cc
//
// CudaOps::hc_mixes and CudaOps::sparse_attn (and attention_index_rows), all on the device
// (cuda/mhc.cu, cuda/attention.cu), BIT-EXACT (docs/cuda.md). Their exp steps are libm_expf, glibc's
// expf rebuilt bit for bit (cuda/libm_expf.h), so they give the reference's std::exp:
//   hc_mixes     hc_raw_mixes [T, (2+hc)*hc], then hc_split_sinkhorn (sigmoid, exp, Sinkhorn)
//   sparse_attn  scores s[t,h,j] = fl(fma_dot(q, kv_j) * scale) (-inf for -1); the online softmax
//                per (t, h) and block (max, rescale = exp(m - m'), p_j = exp(s_j - m'), l with a
//                double p_sum, bf16(p_j); then l += exp(sink - m)); acc[d] = acc[d] * rescale +
//                fma-chain_j(bf16(p_j) * kv_j[d]); out = bf16(acc / l)
// When this process's std::exp is not the libm libm_expf reproduces (libm_expf_matches_host), the
// exp steps run on the host in the reference's own code (reference::hc_split_sinkhorn,
// reference::OnlineSoftmax) on downloaded tensors: still bit-exact, slower.
// Inputs the reference rejects (bad shapes, an index outside [-1, N)) run the reference on the
// host, which raises its own error (counted as a host call).
// kProduction (with sparse_attn among DSV41_CUDA_PRODUCTION_OPS): the production kernel
// (cuda/attention_wgmma.cu, bf16 tensor cores, order-variant; bound scenarios/judge/sparse_attn_mma_bound.h)
// on bf16 copies of q and the KV rows, for head dims 128, 256, 512 and bf16-valued inputs; else the above.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "base/env_switch.h"
#include "cuda/attention_split.h"
#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
#include "formats/minifloat.h"
#include "reference/ops/attention.h"
#include "reference/ops/attention_rows.h"
#include "reference/ops/mhc.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"

namespace dsv41::gpu {

using reference::Tensor;

namespace {
const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }
bool read_named_entries() {
  static const bool on = [] {
    const char* env = std::getenv("DSV41_CUDA_READ_NAMED_ENTRIES");  // "0": every entry (the old path)
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}
// DSV41_CUDA_ATTN_SPLIT=1: the production sparse attention splits each row's index list over
// several CTAs where its rows leave most SMs idle (cuda/attention_wgmma.cu "Split"); unset or "0":
// never (the default until a device has timed and checked it). Read at every call.
bool attn_split_enabled() { return env_switch("DSV41_CUDA_ATTN_SPLIT", false); }
}  // namespace

reference::HcMixes CudaOps::hc_mixes(const Tensor<float>& stream, const reference::HcWeights& w, double norm_eps,
                                     int iters, double hc_eps) const {
  const int64_t hc = stream.rank() == 3 ? stream.dim(1) : 0, dim = stream.rank() == 3 ? stream.dim(2) : 0;
  const int64_t width = hc * dim, n_mix = reference::hc_mix_count(hc);
  const bool ok = stream.rank() == 3 && hc >= 1 && dim >= 1 && width < reference::kTorchSerialSumLimit &&
                  w.fn.numel() == n_mix * width && w.scale.numel() == 3 && w.base.numel() == n_mix;
  if (!ok) {  // the reference raises its error (or handles the shape its own way)
    count("hc_mixes", false);
    reference::HcMixes m = ref().hc_mixes(host_copy(stream), w, norm_eps, iters, hc_eps);
    m.pre = upload(std::move(m.pre));
    m.post = upload(std::move(m.post));
    m.comb = upload(std::move(m.comb));
    return m;
  }
  count("hc_mixes", true);
  const int64_t T = stream.dim(0);
  if (iters >= 1 && libm_expf_matches_host()) {  // the whole op on the device
    reference::HcMixes m{device_tensor<float>({T, hc}, "hc_pre_mix"), device_tensor<float>({T, hc}, "hc_post_mix"),
                         device_tensor<float>({T, hc, hc}, "hc_comb")};
    if (T > 0) {
      DevIn<float> s(stream);
      const Mirror fn = mirror(w.fn.data()), scale = mirror(w.scale.data()), base = mirror(w.base.data());
      DeviceBuffer<float> r(static_cast<size_t>(T)), mixes(static_cast<size_t>(T * n_mix));
      gpu::hc_raw_mixes(s.get(), fn.get(), T, hc, dim, norm_eps, r.get(), mixes.get());
      gpu::hc_split_sinkhorn(mixes.get(), scale.get(), base.get(), T, hc, iters, hc_eps, dev(m.pre), dev(m.post),
                             dev(m.comb));
    }
    return m;
  }
  Tensor<float> raw({T, n_mix}, "hc_mixes");
  if (T > 0) {
    DevIn<float> s(stream);
    const Mirror fn = mirror(w.fn.data());
    DeviceBuffer<float> r(static_cast<size_t>(T)), mixes(static_cast<size_t>(T * n_mix));
    gpu::hc_raw_mixes(s.get(), fn.get(), T, hc, dim, norm_eps, r.get(), mixes.get());
    raw.data() = mixes.download();
  }
  reference::HcMixes m = reference::hc_split_sinkhorn(raw, w.scale.data(), w.base.data(), static_cast<int>(hc),
                                                      iters, hc_eps);
  m.pre = upload(std::move(m.pre));
  m.post = upload(std::move(m.post));
  m.comb = upload(std::move(m.comb));
  return m;
}

// ---- attention.h ----

Tensor<int32_t> CudaOps::attention_index_rows(const Tensor<int32_t>& window, const Tensor<int32_t>& topk,
                                              int64_t offset, int64_t width) const {
  const bool ok = window.rank() == 2 && topk.rank() == 2 && topk.dim(0) == window.dim(0) && topk.dim(1) <= width &&
                  offset >= 0;
  if (!ok) {  // the reference raises its error
    count("attention_index_rows", false);
    return upload(ref().attention_index_rows(host_copy(window), host_copy(topk), offset, width));
  }
  count("attention_index_rows", true);
  const int64_t rows = window.dim(0), kw = window.dim(1), kt = topk.dim(1);
  DevIn<int32_t> w(window), k(topk);
  Tensor<int32_t> out = device_tensor<int32_t>({rows, kw + width}, "topk_idxs");
  gpu::attention_index_rows(w.get(), kw, k.get(), kt, rows, offset, width, dev(out));
  return out;
}

namespace {

// The host stage of sparse_attn: the reference's online softmax (reference::OnlineSoftmax, the
// statements of sparse_attn_row minus its dot products and P.V sums) on the scores s [K] of one
// (query, head): per block of 64, p_bf16 and the numerator's rescale; the final denominator.
void softmax_row(const float* s, int64_t k_total, float sink, float* p_bf16, float* rescale, float* l_out) {
  reference::OnlineSoftmax sm;
  for (int64_t b0 = 0, b = 0; b0 < k_total; b0 += reference::kSparseAttnBlock, ++b) {
    const int64_t nb = std::min<int64_t>(reference::kSparseAttnBlock, k_total - b0);
    rescale[b] = sm.block(s + b0, nb, p_bf16 + b0);
  }
  *l_out = sm.finish(sink);
}

}  // namespace

Tensor<float> CudaOps::sparse_attn(const Tensor<float>& q, const Tensor<float>& window_kv,
                                   const reference::CacheRows& compressed, const Tensor<float>& sink,
                                   const Tensor<int32_t>& idxs, float softmax_scale) const {
  const auto host = [&] {  // the reference raises its error
    count("sparse_attn", false);
    const Tensor<uint8_t> bytes = compressed.bytes ? host_copy(*compressed.bytes) : Tensor<uint8_t>();
    reference::CacheRows c = compressed;
    c.bytes = compressed.bytes ? &bytes : nullptr;
    return upload(ref().sparse_attn(host_copy(q), host_copy(window_kv), c, host_copy(sink), host_copy(idxs),
                                    softmax_scale));
  };
  if (!(q.rank() == 3 && window_kv.rank() == 2 && idxs.rank() == 2)) return host();
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), K = idxs.dim(1);
  if (!(window_kv.dim(1) == D && idxs.dim(0) == T && sink.numel() == H)) return host();
  // The rows the indices name: the window part, then the compressed entries, dequantised on the
  // device: only those some index names, in ascending order, the indices renumbered to them
  // (reference/ops/attention_rows.h: the reference's arithmetic on O(index_topk) entries per decode step),
  // or every entry with DSV41_CUDA_READ_NAMED_ENTRIES=0 (docs/cuda.md "Switches").
  if (compressed.count != 0 && !(compressed.count > 0 && compressed.dim == D)) return host();
  const int64_t W = window_kv.dim(0);
  Tensor<int32_t> hidx = host_copy(idxs);
  if (!reference::attention_rows_in_range(hidx.data(), W, std::max<int64_t>(compressed.count, 0))) return host();
  Tensor<float> kv_used;
  const Tensor<float>* kv = &window_kv;
  if (compressed.count > 0) {
    std::vector<int64_t> used;
    if (read_named_entries()) {
      used = reference::compact_attention_rows(hidx.data(), W, compressed.count);
    } else {  // every entry (read_all_entries): the indices stay as they are
      used.resize(static_cast<size_t>(compressed.count));
      std::iota(used.begin(), used.end(), int64_t{0});
    }
    if (!used.empty()) {
      kv_used = concat_kv_rows(window_kv, read_entries(compressed, used));
      kv = &kv_used;
    }
  }
  count("sparse_attn", true);
  Tensor<float> out = device_tensor<float>({T, H, D}, "sparse_attn_out");
  if (T * H == 0) return out;
  DevIn<float> dq(q), dkv(*kv);
  DevIn<int32_t> di(hidx);
  if (production("sparse_attn") && gpu::sparse_attn_mma_supported(D)) {
    // The production kernel (cuda/attention_wgmma.cu, order-variant) on bf16 copies of q and the KV
    // rows; a value that is not bf16 (outside the reference's input contract) takes the exact path.
    DeviceBuffer<uint16_t> bq(static_cast<size_t>(q.numel())), bkv(static_cast<size_t>(kv->numel()));
    DeviceBuffer<int> flag(1);
    flag.upload(std::vector<int>{0});
    gpu::to_bf16_bits(dq.get(), q.numel(), bq.get(), flag.get());
    gpu::to_bf16_bits(dkv.get(), kv->numel(), bkv.get(), flag.get());
    if (flag.download()[0] == 0) {
      DevIn<float> dsink(sink);
      const int64_t slice_blocks = attn_split_enabled() ? gpu::sparse_attn_wgmma_split_pick(T, H, K) : 0;
      if (slice_blocks > 0) {
        const int64_t bytes = gpu::sparse_attn_wgmma_split_workspace_bytes(T, H, D, K, slice_blocks);
        DeviceBuffer<float> ws(static_cast<size_t>(bytes / static_cast<int64_t>(sizeof(float))));
        gpu::sparse_attn_wgmma_split(bq.get(), bkv.get(), di.get(), dsink.get(), T, H, D, K, softmax_scale, dev(out),
                                     slice_blocks, ws.get());
        return out;
      }
      gpu::sparse_attn_wgmma(bq.get(), bkv.get(), di.get(), dsink.get(), T, H, D, K, softmax_scale, dev(out));
      return out;
    }
  }
  const int64_t blocks = (K + reference::kSparseAttnBlock - 1) / reference::kSparseAttnBlock;
  if (libm_expf_matches_host()) {  // all three stages on the device
    DevIn<float> dsink(sink);
    DeviceBuffer<float> ds(static_cast<size_t>(T * H * K)), dp(static_cast<size_t>(T * H * K)),
        dr(static_cast<size_t>(T * H * blocks)), dl(static_cast<size_t>(T * H));
    if (K > 0) gpu::sparse_attn_scores(dq.get(), dkv.get(), di.get(), T, H, D, K, softmax_scale, ds.get());
    gpu::sparse_attn_softmax(ds.get(), dsink.get(), T, H, K, dp.get(), dr.get(), dl.get());
    gpu::sparse_attn_pv(dkv.get(), di.get(), dp.get(), dr.get(), dl.get(), T, H, D, K, dev(out));
    return out;
  }
  std::vector<float> s(static_cast<size_t>(T * H * K));
  if (!s.empty()) {
    DeviceBuffer<float> ds(s.size());
    gpu::sparse_attn_scores(dq.get(), dkv.get(), di.get(), T, H, D, K, softmax_scale, ds.get());
    s = ds.download();
  }
  const Tensor<float> hsink = host_copy(sink);
  std::vector<float> p(s.size()), rescale(static_cast<size_t>(T * H * blocks)), l(static_cast<size_t>(T * H));
  reference::parallel_for(T * H, [&](int64_t i) {
    softmax_row(s.data() + i * K, K, hsink.data()[static_cast<size_t>(i % H)], p.data() + i * K,
                rescale.data() + i * blocks, l.data() + i);
  });
  const auto up = [](const std::vector<float>& v) { return to_device(v); };
  const auto dp = up(p), dr = up(rescale), dl = up(l);
  gpu::sparse_attn_pv(dkv.get(), di.get(), dp->get(), dr->get(), dl->get(), T, H, D, K, dev(out));
  return out;
}

}  // namespace dsv41::gpu
