#include "scenarios/agree/oracle_run.h"

#include <cstdio>
#include <filesystem>
#include <limits>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/model/model.h"
#include "reports/h5_reader.h"

namespace dsv41::scenarios::agree {
namespace {

namespace fs = std::filesystem;
using reference::Tensor;

std::string root_tie_rule(const std::string& path) {
  reports::H5Reader r(path);
  if (r.attr_type("/", "tie_rule") != reports::H5Reader::Type::kString) return "torch";
  return r.attr_string("/", "tie_rule");
}

void check_shape(const std::vector<int64_t>& got, const std::vector<int64_t>& want, const golden::H5File& f,
                 const std::string& item) {
  if (!want.empty() && got != want) {
    DSV41_FAIL("oracle file '", f.path(), "': item '", item, "' has shape ", reference::shape_string(got),
               ", expected ", reference::shape_string(want));
  }
}

// The values of an integer item, whatever its stored width.
std::vector<int64_t> integers(const golden::H5File& f, const std::string& item, std::vector<int64_t>& shape) {
  const std::string path = item + "/value";
  if (!f.has(path)) DSV41_FAIL("oracle file '", f.path(), "': no item '", item, "'");
  try {
    golden::Array<int64_t> a = f.read<int64_t>(path);
    shape = a.shape;
    return a.data;
  } catch (const Error&) {
  }
  try {
    golden::Array<int32_t> a = f.read<int32_t>(path);
    shape = a.shape;
    return {a.data.begin(), a.data.end()};
  } catch (const Error&) {
  }
  golden::Array<uint8_t> a = f.read<uint8_t>(path);  // throws naming the file and the dataset
  shape = a.shape;
  return {a.data.begin(), a.data.end()};
}

}  // namespace

std::string oracle_layer(int layer) {
  char b[16];
  std::snprintf(b, sizeof b, "layer%02d", layer);
  return b;
}

Tensor<float> OracleRun::bf16(const golden::H5File& f, const std::string& item, const std::vector<int64_t>& shape) {
  if (!f.has(item + "/bits")) DSV41_FAIL("oracle file '", f.path(), "': no bf16 item '", item, "'");
  const golden::Array<uint16_t> a = f.read<uint16_t>(item + "/bits");
  check_shape(a.shape, shape, f, item);
  std::vector<float> v(a.data.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = formats::bf16_decode(a.data[i]);
  return Tensor<float>(a.shape, std::move(v), item);
}

Tensor<float> OracleRun::f32(const golden::H5File& f, const std::string& item, const std::vector<int64_t>& shape) {
  if (!f.has(item + "/value")) DSV41_FAIL("oracle file '", f.path(), "': no fp32 item '", item, "'");
  golden::Array<float> a = f.read<float>(item + "/value");
  check_shape(a.shape, shape, f, item);
  return Tensor<float>(a.shape, std::move(a.data), item);
}

Tensor<int32_t> OracleRun::i32(const golden::H5File& f, const std::string& item, const std::vector<int64_t>& shape) {
  std::vector<int64_t> got_shape;
  const std::vector<int64_t> v = integers(f, item, got_shape);
  check_shape(got_shape, shape, f, item);
  std::vector<int32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    DSV41_CHECK(v[i] >= std::numeric_limits<int32_t>::min() && v[i] <= std::numeric_limits<int32_t>::max(),
                "oracle file '", f.path(), "': item '", item, "' value ", v[i], " is not an int32");
    out[i] = static_cast<int32_t>(v[i]);
  }
  return Tensor<int32_t>(got_shape, std::move(out), item);
}

Tensor<uint8_t> OracleRun::u8(const golden::H5File& f, const std::string& item, const std::vector<int64_t>& shape) {
  std::vector<int64_t> got_shape;
  const std::vector<int64_t> v = integers(f, item, got_shape);
  check_shape(got_shape, shape, f, item);
  std::vector<uint8_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] != 0 ? 1 : 0;
  return Tensor<uint8_t>(got_shape, std::move(out), item);
}

OracleRun OracleRun::open(const std::string& dir) {
  OracleRun r;
  r.dir_ = dir;
  r.name_ = fs::path(dir).lexically_normal().filename().string();
  if (r.name_.empty() || r.name_ == ".") r.name_ = fs::path(dir).lexically_normal().parent_path().filename().string();
  DSV41_CHECK(fs::is_directory(dir), "oracle run '", dir, "': not a directory");
  const auto file = [&](const char* n) {
    const std::string p = (fs::path(dir) / n).string();
    if (!fs::is_regular_file(p)) DSV41_FAIL("oracle run '", dir, "': missing ", n, " (shared/oracle/README.md lists the files)");
    return p;
  };
  r.config_ = reference::load_config_file(file("config.json"));
  r.weights_path_ = file("weights.safetensors");
  r.prefill_ = std::make_unique<golden::H5File>(file("prefill.h5"));
  // Optional: the prefill's per-layer streams (a run recorded without them still has its outputs).
  const std::string streams_path = (fs::path(dir) / "prefill_streams.h5").string();
  if (fs::is_regular_file(streams_path)) r.streams_ = std::make_unique<golden::H5File>(streams_path);
  r.decode_ = std::make_unique<golden::H5File>(file("decode.h5"));
  r.tie_rule_ = root_tie_rule(r.prefill_->path());
  const std::string tie_path = (fs::path(dir) / "tie_lowest_index.h5").string();
  if (r.tie_rule_ != "lowest_index" && fs::is_regular_file(tie_path)) {
    r.tie_ = std::make_unique<golden::H5File>(tie_path);
    DSV41_CHECK(root_tie_rule(tie_path) == "lowest_index", "oracle run '", dir,
                "': tie_lowest_index.h5 does not say tie_rule = lowest_index");
  }
  std::vector<int64_t> shape;
  if (r.prefill_->has("prefill/state/engram/token_map/value")) {
    r.token_map_ = integers(*r.prefill_, "prefill/state/engram/token_map", shape);
  } else if (r.config_.engram_layer_ids.empty()) {
    r.token_map_ = reference::model::default_token_map(r.config_);  // no Engram: the map is never read
  } else {
    DSV41_FAIL("oracle file '", r.prefill_->path(), "': no item 'prefill/state/engram/token_map' (the Engram layers ",
               "hash compressed token ids: the run must say which map it used)");
  }

  OracleStep p;
  p.phase = "prefill";
  p.prefix = "prefill/";
  p.tokens = integers(*r.prefill_, "prefill/tokens", shape);
  p.streams = r.streams_ ? r.streams_.get() : r.prefill_.get();  // without the file: no stream items
  p.items = r.prefill_.get();
  p.logits = "prefill/logits_last";
  r.steps_.push_back(p);
  int64_t pos = static_cast<int64_t>(p.tokens.size());
  for (int k = 0; r.decode_->has("decode/step" + std::to_string(k)); ++k) {
    OracleStep d;
    d.index = k + 1;
    d.phase = "decode";
    d.prefix = "decode/step" + std::to_string(k) + "/";
    d.start_pos = pos;
    d.tokens = integers(*r.decode_, d.prefix + "input_token", shape);
    DSV41_CHECK(d.tokens.size() == 1, "oracle file '", r.decode_->path(), "': ", d.prefix, "input_token holds ",
                d.tokens.size(), " tokens, a decode step one");
    d.streams = r.decode_.get();
    d.items = r.decode_.get();
    d.logits = d.prefix + "logits";
    r.steps_.push_back(d);
    ++pos;
  }
  for (OracleStep& s : r.steps_) {  // the lowest-index run's logits of each step
    s.tie_items = r.tie_ ? r.tie_.get() : s.items;
    s.tie_logits = s.logits;
  }
  // Streams: the embedding and every layer's out_stream at every step (what teacher-forcing forces).
  r.has_streams_ = true;
  for (const OracleStep& s : r.steps_) {
    r.has_streams_ = r.has_streams_ && s.streams->has(s.prefix + "embed/bits");
    for (int l = 0; l < r.config_.n_layers && r.has_streams_; ++l) {
      r.has_streams_ = s.streams->has(s.prefix + oracle_layer(l) + "/out_stream/bits") &&
                       s.items->has(s.prefix + oracle_layer(l) + "/next_pre/value");
    }
  }
  r.has_final_state_ = r.steps_.size() > 1 ? r.decode_->has("decode/final_state/" + oracle_layer(0) + "/window_kv_cache/bits")
                                           : r.prefill_->has("prefill/state/" + oracle_layer(0) + "/window_kv_cache/bits");
  DSV41_CHECK(pos <= r.config_.max_seq_len, "oracle run '", dir, "': ", pos, " positions exceed max_seq_len ",
              r.config_.max_seq_len);
  return r;
}

}  // namespace dsv41::scenarios::agree
