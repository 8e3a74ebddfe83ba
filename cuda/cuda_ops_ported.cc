// cuda/cuda_ops_ported.cc
//
// The ported ops of CudaOps beyond memory/embed/rms_norm/rope (cuda_ops.cc): linears, the cache
// formats (qdq, write_entries, read_entries: the bit-exact packers of cuda/kv_quant.cu), mHC's
// hc_pre / hc_post / hc_identity_pre, and the DSpark helpers. Shapes are checked on the host; any
// input the reference would reject makes the op re-run the reference on host copies, so the
// error is the reference's own (and is counted as a host call); with DSV41_CUDA_DEFER_CHECKS=1 the
// value checks (bf16 inputs, finite rows) are deferred instead (cuda/deferred_checks.h).
#include <algorithm>
#include <numeric>
#include <utility>

#include "cuda/cuda_ops.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "cuda/device.h"
#include "formats/packed.h"

namespace dsv41::gpu {

using reference::DType;
using reference::LinearWeight;
using reference::Tensor;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The reference's shape contract of a linear (reference/ops/linear.cc check_input_shape).
bool linear_shape_ok(const Tensor<float>& x, const LinearWeight& w) {
  const bool values_ok = w.is_packed() ? w.dtype == DType::kF4 && w.w.empty() &&
                                             static_cast<int64_t>(w.packed.size()) * 2 == w.out * w.in
                                       : static_cast<int64_t>(w.w.size()) == w.out * w.in;
  if (!(x.rank() == 2 && x.dim(1) == w.in && w.out > 0 && w.in > 0 && values_ok)) return false;
  int64_t scales = 0;
  if (w.dtype == DType::kF8E4M3) scales = ceil_div(w.out, 32) * ceil_div(w.in, 32);
  if (w.dtype == DType::kF4) scales = w.out * (w.in / 32);
  if (static_cast<int64_t>(w.scale.size()) != scales) return false;
  if ((w.dtype == DType::kF8E4M3 || w.dtype == DType::kF4) && w.in % 32 != 0) return false;
  return w.dtype == DType::kF8E4M3 || w.dtype == DType::kF4 || w.dtype == DType::kBF16 || w.dtype == DType::kF32;
}

// formats::entry_bytes(f, d), or 0 where d is not a valid dim of f (the reference then raises
// its own error).
int64_t entry_bytes_or_0(formats::CacheFormat f, int64_t d) {
  if (d <= 0) return 0;
  try {
    return formats::entry_bytes(f, static_cast<int>(d));
  } catch (const Error&) {
    return 0;
  }
}

// True when every byte of the device flags [n] is 1 (synchronizes).
bool all_set(const DeviceBuffer<uint8_t>& flags) {
  const std::vector<uint8_t> f = flags.download();
  return std::all_of(f.begin(), f.end(), [](uint8_t v) { return v == 1; });
}

}  // namespace

// ---- linear.h ----

Tensor<float> CudaOps::linear_path(const char* op, const Tensor<float>& x, const LinearWeight& w, bool fp32) const {
  time_mark(op);  // counted at the end, once it is known whether it ran as kernels
  const auto host = [&] {
    count(op, false);
    const Tensor<float> hx = host_copy(x);
    return upload(fp32 ? reference::seam::reference_ops().linear_fp32(hx, w) : reference::seam::reference_ops().linear(hx, w));
  };
  if (!linear_shape_ok(x, w)) return host();  // the reference raises its error
  const bool quantized = w.dtype == DType::kF8E4M3 || w.dtype == DType::kF4;
  const bool tile = w.dtype == DType::kF8E4M3;
  DevIn<float> in(x);
  Tensor<float> y = device_tensor<float>({x.dim(0), w.out}, w.name + ".y");
  // A packed F4 weight (reference/ops/linear.h): its prepared byte mirror decoded to this call's values.
  const Mirror wm = w.is_packed() ? Mirror{} : mirror(w.w);
  std::unique_ptr<DeviceBuffer<float>> unpacked;
  if (w.is_packed()) {
    const MirrorOf<uint8_t> pm = mirror(w.packed);
    unpacked = std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(w.out * w.in));
    gpu::unpack_f4(pm.get(), w.out * w.in, unpacked->get());
  }
  const Mirror sm = quantized ? mirror(w.scale) : Mirror{};
  const float* wv = unpacked ? unpacked->get() : wm.get();
  const float* ws = quantized ? sm.get() : nullptr;
  // DSV41_CUDA_DEFER_CHECKS=1: the input check (bf16 values; finite act_quant blocks) goes to a
  // deferred slot instead of being read back; its failure is only ever the reference's error.
  const bool to_bf16 = !fp32 && w.dtype == DType::kBF16;
  const auto what = [&] {
    return detail::concat(op, " '", w.name, "' (", reference::dtype_name(w.dtype), "): an input is not a bf16 value",
                          quantized ? " or an act_quant block is not finite" : "");
  };
  int* check = !fp32 && (quantized || to_bf16) ? deferred_check(what) : nullptr;  // fp32 checks nothing
  int status = 0;
  if (production("linear") && !fp32 && tile && !w.is_packed()) {
    // The production linear (order-variant): fp8 tensor cores, cuda/linear_fp8_mma.cu.
    const MirrorOf<uint8_t> codes = e4m3_codes(w, wv);
    if (check != nullptr) {
      gpu::fp8_mma_linear_async(in.get(), x.dim(0), w.in, codes.get(), ws, w.out, dev(y), check);
    } else {
      status = gpu::fp8_mma_linear(in.get(), x.dim(0), w.in, codes.get(), ws, w.out, dev(y));
    }
  } else if (!fp32 && quantized) {
    if (check != nullptr) {
      gpu::block_scaled_linear_async(in.get(), x.dim(0), w.in, wv, ws, tile, w.out, dev(y), check);
    } else {
      status = gpu::block_scaled_linear(in.get(), x.dim(0), w.in, wv, ws, tile, w.out, dev(y));
    }
  } else if (check != nullptr) {
    gpu::plain_linear_async(in.get(), x.dim(0), w.in, wv, nullptr, tile, w.out, true, dev(y), check);
  } else {
    status = gpu::plain_linear(in.get(), x.dim(0), w.in, wv, fp32 ? ws : nullptr, tile, w.out, to_bf16, dev(y));
  }
  if (status != 0) return host();
  count(op, true);
  return y;
}

Tensor<float> CudaOps::linear(const Tensor<float>& x, const LinearWeight& w) const {
  return linear_path("linear", x, w, false);
}
Tensor<float> CudaOps::linear_fp32(const Tensor<float>& x, const LinearWeight& w) const {
  return linear_path("linear_fp32", x, w, true);
}

Tensor<float> CudaOps::grouped_linear(const Tensor<float>& x, const LinearWeight& w, int groups) const {
  const bool ok = groups > 0 && w.out % groups == 0 && x.rank() == 2 && x.dim(1) == groups * w.in &&
                  w.dtype == DType::kBF16 && static_cast<int64_t>(w.w.size()) == w.out * w.in;
  if (!ok) {
    count("grouped_linear", false);
    return upload(reference::seam::reference_ops().grouped_linear(host_copy(x), w, groups));
  }
  count("grouped_linear", true);
  DevIn<float> in(x);
  Tensor<float> y = device_tensor<float>({x.dim(0), w.out}, w.name + ".y");
  const Mirror wm = mirror(w.w);
  gpu::grouped_linear(in.get(), x.dim(0), groups, w.in, wm.get(), w.out, dev(y));
  return y;
}

// ---- kv_quant.h ----

Tensor<float> CudaOps::qdq(formats::CacheFormat format, const Tensor<float>& x) const {
  time_mark("qdq");  // counted at the end
  const int64_t d = x.rank() >= 1 ? x.dim(x.rank() - 1) : 0;
  const bool dim_ok = entry_bytes_or_0(format, d) > 0;
  const auto host = [&] {
    count("qdq", false);
    return upload(reference::seam::reference_ops().qdq(format, host_copy(x)));
  };
  if (x.rank() < 1 || (format != formats::CacheFormat::kBf16 && !dim_ok)) return host();
  if (format == formats::CacheFormat::kBf16) {  // the ablation: the values as they are
    count("qdq", true);
    return x.on_host() ? upload(x) : Tensor<float>(x);
  }
  const int64_t rows = x.numel() / d, eb = entry_bytes_or_0(format, d);
  DevIn<float> in(x);
  DeviceBuffer<uint8_t> packed(static_cast<size_t>(rows * eb)), finite(static_cast<size_t>(rows));
  Tensor<float> y = device_tensor<float>(x.shape(), x.name() + "_qdq");
  if (rows > 0) {
    gpu::pack_rows(format, in.get(), rows, static_cast<int>(d), packed.get(), finite.get());
    int* check = deferred_check([&] {
      return detail::concat("qdq of '", x.name(), "' through ", formats::info(format).name, ": a row is not finite");
    });
    if (check != nullptr) {
      gpu::flag_unless_all_set(finite.get(), rows, check);
    } else if (!all_set(finite)) {
      return host();  // the reference raises its error
    }
    gpu::unpack_rows(format, packed.get(), rows, static_cast<int>(d), dev(y));
  }
  count("qdq", true);
  return y;
}

void CudaOps::write_entries(Tensor<uint8_t>& storage, formats::CacheFormat format, const std::vector<int64_t>& entries,
                            const Tensor<float>& rows) const {
  time_mark("write_entries");  // counted at the end
  const int64_t n = rows.rank() == 2 ? rows.dim(0) : -1, d = rows.rank() == 2 ? rows.dim(1) : 0;
  bool ok = n == static_cast<int64_t>(entries.size()) && d > 0 && !storage.on_host() && storage.rank() == 2;
  const int64_t eb = ok ? entry_bytes_or_0(format, d) : 0;
  ok = ok && eb > 0 && storage.dim(1) == eb;
  for (int64_t e : entries) ok = ok && e >= 0 && e < storage.dim(0);
  const auto host = [&] {
    count("write_entries", false);
    Tensor<uint8_t> h = host_copy(storage);
    reference::seam::reference_ops().write_entries(h, format, entries, host_copy(rows));
    storage = storage.on_host() ? std::move(h) : upload(std::move(h));
  };
  if (!ok) return host();
  if (n == 0) {
    count("write_entries", true);
    return;
  }
  DevIn<float> in(rows);
  DeviceBuffer<uint8_t> packed(static_cast<size_t>(n * eb)), finite(static_cast<size_t>(n));
  gpu::pack_rows(format, in.get(), n, static_cast<int>(d), packed.get(), finite.get());
  int* check = deferred_check([&] {
    return detail::concat("write_entries into '", storage.name(), "' (", formats::info(format).name, "): row '",
                          rows.name(), "' is not finite");
  });
  if (check != nullptr) {
    gpu::flag_unless_all_set(finite.get(), n, check);
  } else if (!all_set(finite)) {
    return host();  // the reference raises its error
  }
  auto dst = to_device(entries);
  gpu::copy_rows(packed.get(), nullptr, dev(storage), dst->get(), n, eb);
  count("write_entries", true);
}

Tensor<float> CudaOps::read_entries(const reference::CacheRows& cache, const std::vector<int64_t>& entries) const {
  bool ok = cache.bytes != nullptr && cache.dim > 0 && cache.bytes->rank() == 2 && cache.count >= 0;
  const int64_t eb = ok ? entry_bytes_or_0(cache.format, cache.dim) : 0;
  ok = ok && eb > 0 && cache.bytes->dim(1) == eb && cache.count <= cache.bytes->dim(0);
  for (int64_t e : entries) ok = ok && e >= 0 && e < cache.count;
  if (!ok) {
    count("read_entries", false);
    Tensor<uint8_t> h = cache.bytes ? host_copy(*cache.bytes) : Tensor<uint8_t>();
    reference::CacheRows hc = cache;
    hc.bytes = cache.bytes ? &h : nullptr;
    return upload(reference::seam::reference_ops().read_entries(hc, entries));
  }
  count("read_entries", true);
  const int64_t n = static_cast<int64_t>(entries.size());
  DevIn<uint8_t> bytes(*cache.bytes);
  Tensor<float> y = device_tensor<float>({n, cache.dim}, cache.bytes->name());
  if (n == 0) return y;
  DeviceBuffer<uint8_t> gathered(static_cast<size_t>(n * eb));
  auto src = to_device(entries);
  gpu::copy_rows(bytes.get(), src->get(), gathered.get(), nullptr, n, eb);
  gpu::unpack_rows(cache.format, gathered.get(), n, static_cast<int>(cache.dim), dev(y));
  return y;
}

// ---- attention.h: data movement ----

Tensor<float> CudaOps::concat_kv_rows(const Tensor<float>& window, const Tensor<float>& compressed) const {
  if (!(window.rank() == 2 && compressed.rank() == 2 && window.dim(1) == compressed.dim(1))) {
    count("concat_kv_rows", false);
    return upload(reference::seam::reference_ops().concat_kv_rows(host_copy(window), host_copy(compressed)));
  }
  count("concat_kv_rows", true);
  return concat_rows({window, compressed});
}

// ---- mhc.h ----

Tensor<float> CudaOps::hc_identity_pre(int64_t tokens, int64_t hc) const {
  if (tokens < 0 || hc < 1) return upload(reference::seam::reference_ops().hc_identity_pre(tokens, hc));
  count("hc_identity_pre", true);
  Tensor<float> y = device_tensor<float>({tokens, hc}, "hc_identity_pre");
  gpu::hc_identity_pre(tokens, hc, dev(y));
  return y;
}

Tensor<float> CudaOps::hc_pre(const Tensor<float>& stream, const Tensor<float>& pre) const {
  const bool ok = stream.rank() == 3 && pre.rank() == 2 && pre.dim(0) == stream.dim(0) && pre.dim(1) == stream.dim(1);
  if (!ok) {
    count("hc_pre", false);
    return upload(reference::seam::reference_ops().hc_pre(host_copy(stream), host_copy(pre)));
  }
  count("hc_pre", true);
  const int64_t T = stream.dim(0), hc = stream.dim(1), dim = stream.dim(2);
  DevIn<float> s(stream), p(pre);
  Tensor<float> y = device_tensor<float>({T, dim}, "hc_pre_out");
  gpu::hc_pre(s.get(), p.get(), T, hc, dim, dev(y));
  return y;
}

Tensor<float> CudaOps::hc_post(const Tensor<float>& f, const Tensor<float>& residual, const Tensor<float>& post,
                               const Tensor<float>& comb) const {
  const bool ok = residual.rank() == 3 && f.rank() == 2 && f.dim(0) == residual.dim(0) &&
                  f.dim(1) == residual.dim(2) && post.rank() == 2 && post.dim(0) == residual.dim(0) &&
                  post.dim(1) == residual.dim(1) && comb.rank() == 3 && comb.dim(0) == residual.dim(0) &&
                  comb.dim(1) == residual.dim(1) && comb.dim(2) == residual.dim(1);
  if (!ok) {
    count("hc_post", false);
    return upload(
        reference::seam::reference_ops().hc_post(host_copy(f), host_copy(residual), host_copy(post), host_copy(comb)));
  }
  count("hc_post", true);
  const int64_t T = residual.dim(0), hc = residual.dim(1), dim = residual.dim(2);
  DevIn<float> df(f), dr(residual), dp(post), dc(comb);
  Tensor<float> y = device_tensor<float>({T, hc, dim}, "hc_post_out");
  gpu::hc_post(df.get(), dr.get(), dp.get(), dc.get(), T, hc, dim, dev(y));
  return y;
}

// ---- dspark.h ----

Tensor<float> CudaOps::hc_mean(const Tensor<float>& stream) const {
  if (!(stream.rank() == 3 && stream.dim(1) > 0)) {
    count("hc_mean", false);
    return upload(reference::seam::reference_ops().hc_mean(host_copy(stream)));
  }
  count("hc_mean", true);
  const int64_t T = stream.dim(0), hc = stream.dim(1), dim = stream.dim(2);
  DevIn<float> s(stream);
  Tensor<float> y = device_tensor<float>({T, dim}, "main_hidden_part");
  gpu::hc_mean(s.get(), T, hc, dim, dev(y));
  return y;
}

Tensor<float> CudaOps::concat_cols(const std::vector<Tensor<float>>& parts) const {
  bool ok = !parts.empty() && parts.front().rank() == 2;
  int64_t width = 0;
  for (const Tensor<float>& p : parts) {
    ok = ok && p.rank() == 2 && p.dim(0) == parts.front().dim(0);
    if (ok) width += p.dim(1);
  }
  if (!ok) {
    count("concat_cols", false);
    std::vector<Tensor<float>> h;
    for (const Tensor<float>& p : parts) h.push_back(host_copy(p));
    return upload(reference::seam::reference_ops().concat_cols(h));
  }
  count("concat_cols", true);
  const int64_t T = parts.front().dim(0);
  Tensor<float> y = device_tensor<float>({T, width}, "concat");
  int64_t off = 0;
  for (const Tensor<float>& p : parts) {
    DevIn<float> in(p);
    gpu::copy_cols(in.get(), T, p.dim(1), dev(y), width, off);
    off += p.dim(1);
  }
  return y;
}

Tensor<float> CudaOps::concat_rows(const std::vector<Tensor<float>>& parts) const {
  bool ok = !parts.empty() && parts.front().rank() == 2;
  int64_t n = 0;
  for (const Tensor<float>& p : parts) {
    ok = ok && p.rank() == 2 && p.dim(1) == parts.front().dim(1);
    if (ok) n += p.dim(0);
  }
  if (!ok) {
    count("concat_rows", false);
    std::vector<Tensor<float>> h;
    for (const Tensor<float>& p : parts) h.push_back(host_copy(p));
    return upload(reference::seam::reference_ops().concat_rows(h));
  }
  count("concat_rows", true);
  Tensor<float> y = device_tensor<float>({n, parts.front().dim(1)}, "stacked");
  float* out = dev(y);
  for (const Tensor<float>& p : parts) {
    DevIn<float> in(p);
    copy_on_device(out, in.get(), static_cast<size_t>(p.numel()) * sizeof(float));
    out += p.numel();
  }
  return y;
}

void CudaOps::add_markov_bias(Tensor<float>& logits, int64_t slot, const Tensor<float>& bias) const {
  const bool ok = logits.rank() == 2 && bias.rank() == 2 && bias.dim(0) == 1 && bias.dim(1) == logits.dim(1) &&
                  slot >= 0 && slot < logits.dim(0) && !logits.on_host();
  if (!ok) {
    count("add_markov_bias", false);
    Tensor<float> h = host_copy(logits);
    reference::seam::reference_ops().add_markov_bias(h, slot, host_copy(bias));
    logits = logits.on_host() ? std::move(h) : upload(std::move(h));
    return;
  }
  count("add_markov_bias", true);
  DevIn<float> b(bias);
  gpu::add_in_place(dev(logits) + slot * logits.dim(1), b.get(), logits.dim(1));
}

}  // namespace dsv41::gpu
