// python/port_ops.cc: see python/port_ops.h.
#include "python/port_ops.h"

#include "formats/cache_format.h"

namespace dsv41::python {

namespace {

using reference::Tensor;

py::array cache_bytes(const reference::CacheRows& c) {
  const int64_t eb = formats::entry_bytes(c.format, static_cast<int>(c.dim));
  const std::vector<uint8_t>& all = c.bytes->data();
  std::vector<uint8_t> first(all.begin(), all.begin() + c.count * eb);
  return to_numpy(std::move(first), {c.count, eb});
}

py::array i64(const std::vector<int64_t>& v) {
  std::vector<int64_t> c = v;
  return to_numpy(std::move(c), {static_cast<int64_t>(v.size())});
}

std::string where(const char* op, int layer) { return std::string("port op ") + op + " (layer " + std::to_string(layer) + ")"; }

template <typename T>
void check_shape(const Tensor<T>& t, const std::vector<int64_t>& want, const std::string& what) {
  DSV41_CHECK(t.shape() == want, what, ": returned shape ", reference::shape_string(t.shape()), ", expected ",
              reference::shape_string(want));
}

}  // namespace

const std::set<std::string>& PortOps::supported() {
  static const std::set<std::string> s = {"index_scores", "candidate_blocks", "mask_scores", "index_topk", "compress",
                                          "sparse_attn"};
  return s;
}

PortOps::PortOps(py::dict fns) : ForwardingOps(reference::seam::reference_ops(), "reference+python-port"), fns_(std::move(fns)) {
  for (const auto& [k, v] : fns_) {
    const std::string op = py::str(k).cast<std::string>();
    if (!supported().count(op)) {
      std::string known;
      for (const std::string& s : supported()) known += (known.empty() ? "" : ", ") + s;
      DSV41_FAIL("port op '", op, "': not an op a Python port may replace (", known, ")");
    }
    if (!PyCallable_Check(v.ptr())) DSV41_FAIL("port op '", op, "': not callable");
  }
}

PortOps::~PortOps() {
  py::gil_scoped_acquire gil;
  fns_ = py::dict();
}

PyObject* PortOps::fn(const char* op) const {
  py::gil_scoped_acquire gil;
  return fns_.contains(op) ? fns_[op].ptr() : nullptr;
}

Tensor<float> PortOps::index_scores(const Tensor<float>& q, const reference::CacheRows& keys, const Tensor<float>& weights,
                                    const std::vector<int64_t>& reach) const {
  if (!fn("index_scores")) return ForwardingOps::index_scores(q, keys, weights, reach);
  py::gil_scoped_acquire gil;
  const int layer = current_layer();
  py::object r = fns_["index_scores"](layer, py::arg("q") = to_numpy(q), py::arg("keys") = cache_bytes(keys),
                                      py::arg("keys_format") = formats::info(keys.format).name,
                                      py::arg("keys_dim") = keys.dim, py::arg("weights") = to_numpy(weights),
                                      py::arg("reach") = i64(reach));
  Tensor<float> out = to_f32(r, where("index_scores", layer));
  check_shape(out, {q.dim(0), keys.count}, where("index_scores", layer));
  return out;
}

Tensor<uint8_t> PortOps::candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach, int topk_blocks,
                                          int block_size) const {
  if (!fn("candidate_blocks")) return ForwardingOps::candidate_blocks(scores, reach, topk_blocks, block_size);
  py::gil_scoped_acquire gil;
  const int layer = current_layer();
  py::object r = fns_["candidate_blocks"](layer, py::arg("scores") = to_numpy(scores), py::arg("reach") = i64(reach),
                                          py::arg("topk_blocks") = topk_blocks, py::arg("block_size") = block_size);
  Tensor<uint8_t> out = to_int<uint8_t>(r, where("candidate_blocks", layer));
  check_shape(out, scores.shape(), where("candidate_blocks", layer));
  return out;
}

void PortOps::mask_scores(Tensor<float>& scores, const Tensor<uint8_t>& mask) const {
  if (!fn("mask_scores")) return ForwardingOps::mask_scores(scores, mask);
  py::gil_scoped_acquire gil;
  const int layer = current_layer();
  py::object r = fns_["mask_scores"](layer, py::arg("scores") = to_numpy(scores), py::arg("mask") = to_numpy(mask));
  Tensor<float> out = to_f32(r, where("mask_scores", layer));
  check_shape(out, scores.shape(), where("mask_scores", layer));
  out.set_name(scores.name());
  scores = std::move(out);
}

Tensor<int32_t> PortOps::index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach, int k) const {
  if (!fn("index_topk")) return ForwardingOps::index_topk(scores, reach, k);
  py::gil_scoped_acquire gil;
  const int layer = current_layer();
  py::object r = fns_["index_topk"](layer, py::arg("scores") = to_numpy(scores), py::arg("reach") = i64(reach),
                                    py::arg("k") = k);
  Tensor<int32_t> out = to_int<int32_t>(r, where("index_topk", layer));
  check_shape(out, {scores.dim(0), std::min<int64_t>(k, scores.dim(1))}, where("index_topk", layer));
  return out;
}

reference::CompressedLatents PortOps::compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos,
                                               int ratio, Tensor<float>& kv_state, Tensor<float>& score_state) const {
  if (!fn("compress")) return ForwardingOps::compress(kv, score, start_pos, ratio, kv_state, score_state);
  py::gil_scoped_acquire gil;
  const int layer = current_layer();
  const std::string w = where("compress", layer);
  py::object r = fns_["compress"](layer, py::arg("kv") = to_numpy(kv), py::arg("score") = to_numpy(score),
                                  py::arg("start_pos") = start_pos, py::arg("ratio") = ratio,
                                  py::arg("kv_state") = to_numpy(kv_state), py::arg("score_state") = to_numpy(score_state));
  py::tuple t = r.cast<py::tuple>();
  DSV41_CHECK(t.size() == 4, w, ": expected (first_group, latent, kv_state, score_state), got ", t.size(), " values");
  reference::CompressedLatents c;
  c.first_group = t[0].cast<int64_t>();
  c.latent = to_f32(t[1], w + " latent");
  DSV41_CHECK(c.latent.rank() == 2 && c.latent.dim(1) == kv.dim(1), w, ": latent shape ",
              reference::shape_string(c.latent.shape()), ", expected [n, ", kv.dim(1), "]");
  Tensor<float> ks = to_f32(t[2], w + " kv_state"), ss = to_f32(t[3], w + " score_state");
  check_shape(ks, kv_state.shape(), w + " kv_state");
  check_shape(ss, score_state.shape(), w + " score_state");
  ks.set_name(kv_state.name());
  ss.set_name(score_state.name());
  kv_state = std::move(ks);
  score_state = std::move(ss);
  return c;
}

Tensor<float> PortOps::sparse_attn(const Tensor<float>& q, const Tensor<float>& window_kv, const reference::CacheRows& compressed,
                                   const Tensor<float>& sink, const Tensor<int32_t>& idxs, float softmax_scale) const {
  if (!fn("sparse_attn")) return ForwardingOps::sparse_attn(q, window_kv, compressed, sink, idxs, softmax_scale);
  py::gil_scoped_acquire gil;
  const int layer = current_layer();
  py::object r = fns_["sparse_attn"](
      layer, py::arg("q") = to_numpy(q), py::arg("window_kv") = to_numpy(window_kv),
      py::arg("compressed") = compressed.bytes ? cache_bytes(compressed) : to_numpy(std::vector<uint8_t>{}, {0, 0}),
      py::arg("compressed_format") = formats::info(compressed.format).name, py::arg("compressed_dim") = compressed.dim,
      py::arg("sink") = to_numpy(sink), py::arg("idxs") = to_numpy(idxs), py::arg("softmax_scale") = softmax_scale);
  Tensor<float> out = to_f32(r, where("sparse_attn", layer));
  check_shape(out, q.shape(), where("sparse_attn", layer));
  return out;
}

}  // namespace dsv41::python
