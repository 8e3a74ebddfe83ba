// cuda/cuda_ops.cc
//
// CudaOps (cuda/cuda_ops.h): device memory, the weight mirror, the call counts, and the ops that
// run as kernels (cuda/<component>.cu). Each ported op checks shapes on the host as the
// reference does (a shape error is the reference's own error: the op calls the reference's
// checks by re-running it on host copies), then launches. The host fallbacks are in
// cuda/cuda_fallback.cc.
#include "cuda/cuda_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <utility>

#include "base/env_switch.h"
#include "cuda/deferred_checks.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "cuda/device.h"
#include "formats/packed.h"

namespace dsv41::gpu {

using reference::Tensor;

struct CudaOps::State {
  std::mutex mu;
  std::map<const void*, std::unique_ptr<DeviceBuffer<float>>> mirrors;  // host values -> device copy
  std::map<const void*, std::unique_ptr<DeviceBuffer<uint8_t>>> byte_mirrors;  // the same for bytes
  // kProduction: a prepared F8 weight's E4M3 codes, by the host address of its values.
  std::map<const void*, std::unique_ptr<DeviceBuffer<uint8_t>>> e4m3_codes;
  std::map<std::string, OpCalls> calls;
  // kProduction: the production ops enabled (DSV41_CUDA_PRODUCTION_OPS; default all).
  std::set<std::string> production;
  // DSV41_CUDA_OP_TIMES=1: the device is synchronized at every op's count() and the wall time
  // since the previous one is charged to that previous op (its kernels, its host work and the
  // model's host code up to the next op): a rough profile, printed on stderr when the ops end.
  bool timing = false;
  std::string last_op;
  std::chrono::steady_clock::time_point last;
  std::map<std::string, double> seconds;
  // DSV41_CUDA_DEFER_CHECKS=1: the deferred checks' slots (made on first use) and what each holds.
  // check_mu is held across a whole synchronizing copy (stage, copy, settle).
  static constexpr int kCheckSlots = 1024;
  bool defer = false;
  std::mutex check_mu;
  std::unique_ptr<CheckSlots> slots;
  PendingChecks pending{kCheckSlots};
};

CudaOps::CudaOps(CudaMode mode) : mode_(mode), s_(std::make_unique<State>()) {
  DSV41_CHECK(device_count() > 0, "backend ", name(), ": no CUDA device (gpu::device_count() == 0)");
  s_->timing = env_switch("DSV41_CUDA_OP_TIMES", false);
  s_->defer = defer_checks();
  std::vector<std::string> names;
  for (const std::string& op : production_ops()) names.push_back(op.substr(0, op.find(' ')));
  const char* env = std::getenv("DSV41_CUDA_PRODUCTION_OPS");
  if (env == nullptr || std::string(env) == "all") {
    // The default: every production op except those not yet run on a device (named explicitly to
    // be on; docs/cuda.md "Production ops").
    for (const std::string& op : names) {
      if (std::find(opt_in_ops().begin(), opt_in_ops().end(), op) == opt_in_ops().end()) s_->production.insert(op);
    }
  } else {
    std::stringstream list(env);
    for (std::string op; std::getline(list, op, ',');) {
      if (op.empty() || op == "none") continue;
      DSV41_CHECK(std::find(names.begin(), names.end(), op) != names.end(), "DSV41_CUDA_PRODUCTION_OPS: unknown op '", op,
                  "' (production ops: linear, sparse_attn, indexer; or all, none)");
      s_->production.insert(op);
    }
  }
}
bool CudaOps::production(const char* op) const {
  return mode_ == CudaMode::kProduction && s_->production.count(op) != 0;
}
CudaOps::~CudaOps() {
  if (!s_->timing || s_->seconds.empty()) return;
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto& [op, sec] : s_->seconds) {
    rows.emplace_back(sec, op);
    total += sec;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(stderr, "cuda op times (DSV41_CUDA_OP_TIMES, synchronized; from an op's start to the next op's): %.3f s\n", total);
  for (const auto& [sec, op] : rows) {
    const OpCalls& c = s_->calls[op];
    std::fprintf(stderr, "  %-22s %9.3f s %5.1f %%  %ld calls\n", op.c_str(), sec, total > 0 ? 100.0 * sec / total : 0.0,
                 static_cast<long>(c.gpu + c.host));
  }
}

std::vector<std::string> CudaOps::ported() {
  return {"upload", "download", "slice_rows", "embed", "linear", "linear_fp32", "grouped_linear", "rms_norm",
          "rope_rows", "qdq", "write_entries", "read_entries", "concat_kv_rows", "hc_identity_pre", "hc_pre",
          "hc_post", "hc_mean", "concat_cols", "concat_rows", "add_markov_bias", "hc_mixes", "sparse_attn",
          "attention_index_rows", "engram_lookup", "engram_gate_residual", "moe_gate",
          "moe_experts", "index_weights", "index_scores",
          "candidate_blocks", "mask_scores", "index_topk", "index_select", "compress"};
}
std::vector<std::string> CudaOps::production_ops() { return {"linear F8", "sparse_attn", "indexer"}; }
// A production op joins the default ("all") once its device test has passed; none is held back now
// (indexer: tests/cuda/index_select_production_test passed on the H100 in session 18, bench/RESULTS.md).
const std::vector<std::string>& CudaOps::opt_in_ops() {
  static const std::vector<std::string> ops = {};
  return ops;
}
std::vector<std::string> CudaOps::host_fallbacks() {
  return {"engram_hash_ids", "moe_routing_weights"};
}

std::map<std::string, OpCalls> CudaOps::counts() const {
  std::lock_guard<std::mutex> l(s_->mu);
  return s_->calls;
}
void CudaOps::reset_counts() const {
  std::lock_guard<std::mutex> l(s_->mu);
  s_->calls.clear();
}
void CudaOps::count(const char* op, bool on_gpu) const {
  time_mark(op);
  std::lock_guard<std::mutex> l(s_->mu);
  OpCalls& c = s_->calls[op];
  (on_gpu ? c.gpu : c.host) += 1;
}
void CudaOps::time_mark(const char* op) const {
  if (!s_->timing) return;
  synchronize();
  std::lock_guard<std::mutex> l(s_->mu);
  const auto now = std::chrono::steady_clock::now();
  if (!s_->last_op.empty()) s_->seconds[s_->last_op] += std::chrono::duration<double>(now - s_->last).count();
  s_->last_op = op;
  s_->last = now;
}

// ---- deferred checks ----

bool CudaOps::defers_checks() const { return s_->defer; }

void CudaOps::set_defer_checks(bool on) const {
  resolve_checks();
  s_->defer = on;
}

int* CudaOps::check_slot(std::string what) const {
  std::lock_guard<std::mutex> l(s_->check_mu);
  if (!s_->slots) s_->slots = std::make_unique<CheckSlots>(State::kCheckSlots);
  if (s_->pending.full()) {  // resolve the full span first (a synchronization: the event's wait)
    s_->slots->stage(s_->pending.pending());
    s_->pending.resolve(s_->slots->settle(), s_->pending.pending());
  }
  return s_->slots->slot(s_->pending.add(std::move(what)));
}

int CudaOps::stage_checks() const {
  if (!defers_checks()) return 0;
  const int n = s_->pending.pending();
  if (n > 0) s_->slots->stage(n);
  return n;
}

void CudaOps::settle_checks(int staged) const {
  if (staged == 0) return;
  s_->pending.resolve(s_->slots->settle(), staged);
}

void CudaOps::resolve_checks() const {
  if (!defers_checks()) return;
  std::lock_guard<std::mutex> l(s_->check_mu);
  settle_checks(stage_checks());  // no copy in between: settle waits for the staged one
}

CudaOps::Mirror CudaOps::mirror(const float* host, size_t n) const {
  Mirror m;
  {
    std::lock_guard<std::mutex> l(s_->mu);
    const auto it = s_->mirrors.find(host);
    if (it != s_->mirrors.end() && it->second->size() == n) {
      m.p_ = it->second->get();
      return m;
    }
  }
  m.temp_ = std::make_unique<DeviceBuffer<float>>(n);  // not registered: this call's copy only
  if (n > 0) copy_to_device(m.temp_->get(), host, n * sizeof(float));
  m.p_ = m.temp_->get();
  return m;
}

CudaOps::MirrorOf<uint8_t> CudaOps::mirror(const std::vector<uint8_t>& host_v) const {
  const uint8_t* host = host_v.data();
  const size_t n = host_v.size();
  MirrorOf<uint8_t> m;
  {
    std::lock_guard<std::mutex> l(s_->mu);
    const auto it = s_->byte_mirrors.find(host);
    if (it != s_->byte_mirrors.end() && it->second->size() == n) {
      m.p_ = it->second->get();
      return m;
    }
  }
  m.temp_ = std::make_unique<DeviceBuffer<uint8_t>>(n);  // not registered: this call's copy only
  if (n > 0) copy_to_device(m.temp_->get(), host, n);
  m.p_ = m.temp_->get();
  return m;
}

CudaOps::MirrorOf<uint8_t> CudaOps::e4m3_codes(const reference::LinearWeight& w, const float* device_values) const {
  MirrorOf<uint8_t> m;
  const size_t n = w.w.size();
  std::lock_guard<std::mutex> l(s_->mu);
  const auto mirrored = s_->mirrors.find(w.w.data());
  const bool prepared = mirrored != s_->mirrors.end() && mirrored->second->size() == n;
  if (prepared) {
    auto it = s_->e4m3_codes.find(w.w.data());
    if (it == s_->e4m3_codes.end() || it->second->size() != n) {
      auto buf = std::make_unique<DeviceBuffer<uint8_t>>(n);
      encode_e4m3(device_values, static_cast<int64_t>(n), buf->get());
      it = s_->e4m3_codes.insert_or_assign(w.w.data(), std::move(buf)).first;
    }
    m.p_ = it->second->get();
    return m;
  }
  m.temp_ = std::make_unique<DeviceBuffer<uint8_t>>(n);  // not prepared: this call's codes only
  encode_e4m3(device_values, static_cast<int64_t>(n), m.temp_->get());
  m.p_ = m.temp_->get();
  return m;
}

void CudaOps::register_mirror(const uint8_t* host, size_t n) const {
  auto buf = std::make_unique<DeviceBuffer<uint8_t>>(n);
  if (n > 0) copy_to_device(buf->get(), host, n);
  std::lock_guard<std::mutex> l(s_->mu);
  s_->byte_mirrors[host] = std::move(buf);
}

void CudaOps::register_mirror(const float* host, size_t n) const {
  auto buf = std::make_unique<DeviceBuffer<float>>(n);
  if (n > 0) copy_to_device(buf->get(), host, n * sizeof(float));
  std::lock_guard<std::mutex> l(s_->mu);
  s_->mirrors[host] = std::move(buf);
  s_->e4m3_codes.erase(host);  // codes of values once at this address are stale
}

// ---- memory ----

namespace {

// Every host array prepare() mirrors: the dense weights the ported ops read, then the RoPE tables
// ([max_seq_len, rd/2] fp32 each), the MoE gate and routed experts, the Engram tables (bytes) and
// q/k weights. The mHC weights fn, scale and base (the device Sinkhorn reads the last two; mirrored
// they cost no upload per call); the MoE gate bias serves the host-side routing.
void for_each_mirrored(const reference::checkpoint::ModelWeights& wt, const std::vector<reference::RopeTable>& rope,
                       const std::function<void(const float*, size_t)>& f,
                       const std::function<void(const uint8_t*, size_t)>& bytes) {
  const auto v = [&f](const std::vector<float>& x) { f(x.data(), x.size()); };
  const auto lin = [&v, &bytes](const reference::LinearWeight& w) {
    if (!w.w.empty()) v(w.w);
    if (w.is_packed()) bytes(w.packed.data(), w.packed.size());  // F4 codes, decoded per call
    if (!w.scale.empty()) v(w.scale);
  };
  v(wt.embed.data());
  v(wt.norm.data());
  lin(wt.head);
  for (const reference::checkpoint::BlockWeights& b : wt.blocks) {
    v(b.attn_norm.data());
    v(b.ffn_norm.data());
    const reference::checkpoint::AttentionWeights& a = b.attn;
    for (const reference::LinearWeight* lw : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.comp_wkv, &a.comp_wgate,
                                              &a.idx_wq_b, &a.idx_weights_proj, &a.idx_wk, &b.ffn.s_w1, &b.ffn.s_w2,
                                              &b.ffn.s_w3, &b.engram.wkv}) {
      lin(*lw);
    }
    for (const Tensor<float>* t : {&a.q_norm, &a.kv_norm, &a.comp_norm, &a.idx_k_norm}) v(t->data());
    lin(b.ffn.gate);
    for (const std::vector<reference::LinearWeight>* ws : {&b.ffn.w1, &b.ffn.w2, &b.ffn.w3}) {
      for (const reference::LinearWeight& w : *ws) lin(w);
    }
    for (const reference::HcWeights* hw : {&b.hc_attn, &b.hc_ffn}) {
      v(hw->fn.data());
      v(hw->scale.data());
      v(hw->base.data());
    }
    if (b.has_engram) {
      v(b.engram.q_weight.data());
      v(b.engram.k_weight.data());
      bytes(b.engram.table.data().data(), b.engram.table.data().size());
      bytes(b.engram.table_scale.data().data(), b.engram.table_scale.data().size());
    }
  }
  lin(wt.dspark.main_proj);
  lin(wt.dspark.markov_head);
  lin(wt.dspark.confidence_proj);
  v(wt.dspark.main_norm.data());
  v(wt.dspark.norm.data());
  for (const reference::RopeTable& r : rope) {
    const size_t n = static_cast<size_t>(r.max_seq_len() * (r.rope_dim() / 2));
    f(r.cos(0), n);
    f(r.sin(0), n);
  }
}

}  // namespace

// Copied again even when an address is known: a new model's weights may sit where a freed one's were.
void CudaOps::prepare(const reference::checkpoint::ModelWeights& wt, const std::vector<reference::RopeTable>& rope) const {
  for_each_mirrored(
      wt, rope, [this](const float* p, size_t n) { register_mirror(p, n); },
      [this](const uint8_t* p, size_t n) { register_mirror(p, n); });
}

void CudaOps::release(const reference::checkpoint::ModelWeights& wt, const std::vector<reference::RopeTable>& rope) const {
  std::lock_guard<std::mutex> l(s_->mu);
  for_each_mirrored(
      wt, rope,
      [this](const float* p, size_t) {
        s_->mirrors.erase(p);
        s_->e4m3_codes.erase(p);
      },
      [this](const uint8_t* p, size_t) { s_->byte_mirrors.erase(p); });
}

namespace {

template <typename T>
Tensor<T> upload_any(Tensor<T> host) {
  if (!host.on_host()) return host;
  Tensor<T> d = device_tensor<T>(host.shape(), host.name());
  if (host.numel() > 0) copy_to_device(dev(d), host.data().data(), static_cast<size_t>(host.numel()) * sizeof(T));
  return d;
}

template <typename T>
Tensor<T> slice_any(const Tensor<T>& x, int64_t first, int64_t count) {
  if (x.on_host()) return upload_any(reference::slice_rows(x, first, count));
  DSV41_CHECK(x.rank() >= 1 && first >= 0 && count >= 0 && first + count <= x.dim(0), "rows [", first, ", ",
              first + count, ") outside ", x.rank() >= 1 ? x.dim(0) : 0, " rows of '", x.name(), "'");
  std::vector<int64_t> shape = x.shape();
  const int64_t row = x.dim(0) == 0 ? 0 : x.numel() / x.dim(0);
  shape[0] = count;
  Tensor<T> y = device_tensor<T>(shape, x.name());
  copy_on_device(dev(y), dev(x) + first * row, static_cast<size_t>(count * row) * sizeof(T));
  return y;
}

}  // namespace

// Every copy to the host resolves the pending deferred checks: their flags travel (asynchronously)
// just before it, and are read once it has synchronized.
template <typename T>
Tensor<T> CudaOps::host_copy(const Tensor<T>& t) const {
  if (t.on_host()) return t;
  std::unique_lock<std::mutex> l(s_->check_mu, std::defer_lock);
  if (defers_checks()) l.lock();
  const int staged = stage_checks();
  Tensor<T> h(t.shape(), t.name());
  if (t.numel() > 0) copy_to_host(h.data().data(), dev(t), static_cast<size_t>(t.numel()) * sizeof(T));
  settle_checks(staged);
  return h;
}
template Tensor<float> CudaOps::host_copy(const Tensor<float>&) const;
template Tensor<int32_t> CudaOps::host_copy(const Tensor<int32_t>&) const;
template Tensor<int64_t> CudaOps::host_copy(const Tensor<int64_t>&) const;
template Tensor<uint8_t> CudaOps::host_copy(const Tensor<uint8_t>&) const;

Tensor<float> CudaOps::upload(Tensor<float> h) const { return upload_any(std::move(h)); }
Tensor<int32_t> CudaOps::upload(Tensor<int32_t> h) const { return upload_any(std::move(h)); }
Tensor<int64_t> CudaOps::upload(Tensor<int64_t> h) const { return upload_any(std::move(h)); }
Tensor<uint8_t> CudaOps::upload(Tensor<uint8_t> h) const { return upload_any(std::move(h)); }
Tensor<float> CudaOps::download(Tensor<float> t) const { return t.on_host() ? std::move(t) : host_copy(t); }
Tensor<int32_t> CudaOps::download(Tensor<int32_t> t) const { return t.on_host() ? std::move(t) : host_copy(t); }
Tensor<int64_t> CudaOps::download(Tensor<int64_t> t) const { return t.on_host() ? std::move(t) : host_copy(t); }
Tensor<uint8_t> CudaOps::download(Tensor<uint8_t> t) const { return t.on_host() ? std::move(t) : host_copy(t); }
Tensor<float> CudaOps::slice_rows(const Tensor<float>& x, int64_t first, int64_t count) const {
  return slice_any(x, first, count);
}
Tensor<uint8_t> CudaOps::slice_rows(const Tensor<uint8_t>& x, int64_t first, int64_t count) const {
  return slice_any(x, first, count);
}
Tensor<int32_t> CudaOps::slice_rows(const Tensor<int32_t>& x, int64_t first, int64_t count) const {
  return slice_any(x, first, count);
}

// ---- embedding, rmsnorm, rope ----

Tensor<float> CudaOps::embed(const std::vector<int64_t>& tokens, const Tensor<float>& table, int64_t hc) const {
  DSV41_CHECK(table.rank() == 2 && hc > 0, "embed: table '", table.name(), "' ", reference::shape_string(table.shape()),
              ", hc ", hc);
  const int64_t T = static_cast<int64_t>(tokens.size()), vocab = table.dim(0), dim = table.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = tokens[static_cast<size_t>(t)];
    DSV41_CHECK(id >= 0 && id < vocab, "embed: token ", t, " = ", id, " is outside the vocab [0, ", vocab, ")");
  }
  count("embed", true);
  const Mirror host_tab = table.on_host() ? mirror(table.data()) : Mirror{};
  const float* tab = table.on_host() ? host_tab.get() : dev(table);
  auto ids = to_device(tokens);
  Tensor<float> y = device_tensor<float>({T, hc, dim}, "stream");
  gpu::embed(ids->get(), T, tab, dim, hc, dev(y));
  return y;
}

Tensor<float> CudaOps::rms_norm(const Tensor<float>& x, const Tensor<float>& weight, double eps) const {
  const int64_t n = x.rank() >= 1 ? x.dim(x.rank() - 1) : 0;
  if (x.rank() < 1 || n <= 0 || weight.numel() != n || n >= reference::kTorchSerialSumLimit) {
    count("rms_norm", false);  // the reference raises its error
    return upload(reference::seam::reference_ops().rms_norm(host_copy(x), host_copy(weight), eps));
  }
  count("rms_norm", true);
  DevIn<float> in(x);
  const Mirror host_w = weight.on_host() ? mirror(weight.data()) : Mirror{};
  const float* w = weight.on_host() ? host_w.get() : dev(weight);
  Tensor<float> y = device_tensor<float>(x.shape(), x.name() + ".rms_norm");
  gpu::rms_norm(in.get(), w, x.numel() / n, n, eps, dev(y));
  return y;
}

void CudaOps::rope_rows(Tensor<float>& x, int64_t heads, const reference::RopeTable& rope, int64_t first_pos,
                        int64_t pos_stride, bool inverse) const {
  const int64_t rd = rope.rope_dim();
  const bool shape_ok = x.rank() == 2 && heads > 0 && x.dim(1) % heads == 0 && x.dim(1) / heads >= rd;
  const int64_t T = shape_ok ? x.dim(0) : 0;
  const bool pos_ok = T == 0 || (first_pos >= 0 && first_pos + (T - 1) * pos_stride < rope.max_seq_len() &&
                                 first_pos + (T - 1) * pos_stride >= 0);
  if (!shape_ok || !pos_ok || x.on_host()) {
    count("rope_rows", false);  // the reference raises its error (or: a host tensor stays on the host)
    Tensor<float> h = host_copy(x);
    reference::seam::reference_ops().rope_rows(h, heads, rope, first_pos, pos_stride, inverse);
    x = x.on_host() ? std::move(h) : upload(std::move(h));
    return;
  }
  count("rope_rows", true);
  const int64_t half = rd / 2, table = rope.max_seq_len() * half;
  // The [max_seq_len, rd/2] tables: prepare()'s mirrors, or this call's copies.
  const Mirror dcos = mirror(rope.cos(0), static_cast<size_t>(table));
  const Mirror dsin = mirror(rope.sin(0), static_cast<size_t>(table));
  gpu::rope_rows(dev(x), T, heads, x.dim(1) / heads, rd, dcos.get(), dsin.get(), first_pos, pos_stride, inverse);
}

}  // namespace dsv41::gpu
