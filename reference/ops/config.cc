#include "base/json_limits.h"
#include "reference/ops/config.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/input_file.h"

// The preset texts, generated into the build tree from reference/presets/*.json.
namespace dsv41::reference::presets {
extern const char kTinyJson[];
extern const char kFullJson[];
}  // namespace dsv41::reference::presets

namespace dsv41::reference {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

enum class Need : uint8_t { kRequired, kOptional };

// Every field with its key, in declaration order. The parser, the serializers and the hash all
// walk this one list, so a field cannot be parsed but left out of the hash.
template <typename Config, typename Visitor>
void visit_fields(Config& c, Visitor&& v) {
  constexpr Need R = Need::kRequired;
  constexpr Need O = Need::kOptional;
  v("max_batch_size", c.max_batch_size, O);
  v("max_seq_len", c.max_seq_len, O);
  v("temperature", c.temperature, O);
  v("dtype", c.dtype, R);
  v("expert_dtype", c.expert_dtype, R);
  v("vocab_size", c.vocab_size, R);
  v("dim", c.dim, R);
  v("moe_inter_dim", c.moe_inter_dim, R);
  v("n_layers", c.n_layers, R);
  v("n_mtp_layers", c.n_mtp_layers, R);
  v("n_heads", c.n_heads, R);
  v("n_routed_experts", c.n_routed_experts, R);
  v("n_shared_experts", c.n_shared_experts, R);
  v("n_activated_experts", c.n_activated_experts, R);
  v("score_func", c.score_func, R);
  v("gate_temp", c.gate_temp, O);
  v("norm_topk_prob", c.norm_topk_prob, O);
  v("route_scale", c.route_scale, R);
  v("swiglu_limit", c.swiglu_limit, R);
  v("q_lora_rank", c.q_lora_rank, R);
  v("head_dim", c.head_dim, R);
  v("rope_head_dim", c.rope_head_dim, R);
  v("norm_eps", c.norm_eps, R);
  v("o_groups", c.o_groups, R);
  v("o_lora_rank", c.o_lora_rank, R);
  v("window_size", c.window_size, R);
  v("compress_ratios", c.compress_ratios, R);
  v("kv_source_layers", c.kv_source_layers, R);
  v("index_source_layers", c.index_source_layers, R);
  v("compress_rope_theta", c.compress_rope_theta, R);
  v("original_seq_len", c.original_seq_len, R);
  v("rope_theta", c.rope_theta, R);
  v("rope_factor", c.rope_factor, R);
  v("beta_fast", c.beta_fast, R);
  v("beta_slow", c.beta_slow, R);
  v("index_n_heads", c.index_n_heads, R);
  v("index_head_dim", c.index_head_dim, R);
  v("index_topk", c.index_topk, R);
  v("candidate_source_layer", c.candidate_source_layer, R);
  v("candidate_topk_blocks", c.candidate_topk_blocks, R);
  v("candidate_block_size", c.candidate_block_size, R);
  v("hc_mult", c.hc_mult, R);
  v("hc_sinkhorn_iters", c.hc_sinkhorn_iters, R);
  v("hc_eps", c.hc_eps, R);
  v("engram_layer_ids", c.engram_layer_ids, R);
  v("engram_num_embeddings", c.engram_num_embeddings, R);
  v("engram_max_ngram_size", c.engram_max_ngram_size, R);
  v("engram_vocab_size", c.engram_vocab_size, R);
  v("engram_n_heads", c.engram_n_heads, R);
  v("engram_head_dim", c.engram_head_dim, R);
  v("engram_pad_id", c.engram_pad_id, R);
  v("engram_compressed_vocab_size", c.engram_compressed_vocab_size, R);
  v("vision_n_layers", c.vision_n_layers, R);
  v("vision_dim", c.vision_dim, R);
  v("vision_n_heads", c.vision_n_heads, R);
  v("vision_inter_dim", c.vision_inter_dim, R);
  v("vision_patch_size", c.vision_patch_size, R);
  v("vision_rope_theta", c.vision_rope_theta, R);
  v("vision_downsample_ratio", c.vision_downsample_ratio, R);
  v("vision_max_n_token", c.vision_max_n_token, R);
  v("vision_min_pixels", c.vision_min_pixels, R);
  v("vision_max_wh_ratio", c.vision_max_wh_ratio, R);
  v("image_token_id", c.image_token_id, R);
  v("dspark_block_size", c.dspark_block_size, R);
  v("dspark_noise_token_id", c.dspark_noise_token_id, R);
  v("dspark_target_layer_ids", c.dspark_target_layer_ids, R);
  v("dspark_markov_rank", c.dspark_markov_rank, R);
  v("dspark_n_routed_experts", c.dspark_n_routed_experts, R);
  v("dspark_n_activated_experts", c.dspark_n_activated_experts, R);
}

// JSON names of the enums; nullptr stands for JSON null.
template <typename E>
struct EnumNames;
template <>
struct EnumNames<WeightDtype> {
  static constexpr std::pair<WeightDtype, const char*> kAll[] = {{WeightDtype::kBf16, "bf16"},
                                                                 {WeightDtype::kFp8, "fp8"}};
};
template <>
struct EnumNames<ExpertDtype> {
  static constexpr std::pair<ExpertDtype, const char*> kAll[] = {{ExpertDtype::kDefault, nullptr},
                                                                 {ExpertDtype::kFp4, "fp4"}};
};
template <>
struct EnumNames<ScoreFunc> {
  static constexpr std::pair<ScoreFunc, const char*> kAll[] = {
      {ScoreFunc::kSoftmax, "softmax"},
      {ScoreFunc::kSigmoid, "sigmoid"},
      {ScoreFunc::kSqrtSoftplus, "sqrtsoftplus"}};
};

template <typename E>
const char* enum_name(E e) {
  for (const auto& [value, text] : EnumNames<E>::kAll) {
    if (value == e) return text ? text : "null";
  }
  return "?";
}

template <typename E>
std::string enum_choices() {
  std::string s;
  for (const auto& [value, text] : EnumNames<E>::kAll) {
    if (!s.empty()) s.append(", ");
    if (text) {
      s.append("\"").append(text).append("\"");
    } else {
      s.append("null");
    }
  }
  return s;
}

std::string short_dump(const Json& j) {
  std::string s = j.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// ---- parsing ----

class FieldReader {
 public:
  FieldReader(const Json& root, const std::string& source) : root_(root), source_(source) {}

  template <typename T>
  void operator()(const char* key, T& member, Need need) {
    const auto it = root_.find(key);
    if (it == root_.end()) {
      if (need == Need::kRequired) fail(key, "missing required key");
      return;
    }
    read(key, *it, member);
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const std::string& key, Args&&... args) const {
    DSV41_FAIL("config ", source_, ": field '", key, "': ", std::forward<Args>(args)...);
  }

  int64_t read_int(const std::string& key, const Json& j, int64_t lo, int64_t hi) const {
    if (!j.is_number_integer()) {
      fail(key, "expected an integer, got ", j.type_name(), " ", short_dump(j));
    }
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(hi)) {
      fail(key, "integer ", short_dump(j), " is out of range [", lo, ", ", hi, "]");
    }
    const int64_t v = j.get<int64_t>();
    if (v < lo || v > hi) fail(key, "integer ", v, " is out of range [", lo, ", ", hi, "]");
    return v;
  }
  void read(const std::string& key, const Json& j, int& out) const {
    out = static_cast<int>(read_int(key, j, std::numeric_limits<int>::min(),
                                    std::numeric_limits<int>::max()));
  }
  void read(const std::string& key, const Json& j, int64_t& out) const {
    out = read_int(key, j, std::numeric_limits<int64_t>::min(),
                   std::numeric_limits<int64_t>::max());
  }
  void read(const std::string& key, const Json& j, double& out) const {
    if (!j.is_number()) fail(key, "expected a number, got ", j.type_name(), " ", short_dump(j));
    out = j.get<double>();
  }
  void read(const std::string& key, const Json& j, bool& out) const {
    if (!j.is_boolean()) {
      fail(key, "expected true or false, got ", j.type_name(), " ", short_dump(j));
    }
    out = j.get<bool>();
  }
  void read(const std::string& key, const Json& j, std::optional<int>& out) const {
    if (j.is_null()) {
      out.reset();
      return;
    }
    int v = 0;
    read(key, j, v);
    out = v;
  }
  template <typename T>
  void read(const std::string& key, const Json& j, std::vector<T>& out) const {
    if (!j.is_array()) {
      fail(key, "expected an array of integers, got ", j.type_name(), " ", short_dump(j));
    }
    out.assign(j.size(), T{});
    for (size_t i = 0; i < j.size(); ++i) read(key + "[" + std::to_string(i) + "]", j[i], out[i]);
  }
  template <typename E, typename = decltype(EnumNames<E>::kAll)>
  void read(const std::string& key, const Json& j, E& out) const {
    for (const auto& [value, text] : EnumNames<E>::kAll) {
      if ((text == nullptr && j.is_null()) || (text != nullptr && j.is_string() && j == text)) {
        out = value;
        return;
      }
    }
    fail(key, "expected one of ", enum_choices<E>(), ", got ", short_dump(j));
  }

  const Json& root_;
  const std::string& source_;
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

void check_known_keys(const Json& root, const std::string& source) {
  std::vector<std::string> known;
  ModelConfig probe;
  visit_fields(probe, [&](const char* key, auto&, Need) { known.emplace_back(key); });
  for (const auto& item : root.items()) {
    if (std::find(known.begin(), known.end(), item.key()) != known.end()) continue;
    std::string best;
    size_t best_d = 3;  // suggest only close matches
    for (const std::string& k : known) {
      const size_t d = edit_distance(item.key(), k);
      if (d < best_d) best_d = d, best = k;
    }
    DSV41_FAIL("config ", source, ": field '", item.key(), "': unknown key",
               best.empty() ? "" : " (did you mean '" + best + "'?)",
               "; known keys are the upstream ModelArgs fields, see docs/config.md");
  }
}

Json parse_json_text(const std::string& text, const std::string& source) {
  std::set<std::string> keys;
  const Json::parser_callback_t reject_duplicates = [&](int depth, Json::parse_event_t event,
                                                        Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second) {
      DSV41_FAIL("config ", source, ": field '", parsed.get<std::string>(), "': duplicate key");
    }
    return true;
  };
  dsv41::check_json_nesting(text, "config " + source);
  try {
    return Json::parse(text, reject_duplicates);
  } catch (const Json::exception& e) {
    std::string what = e.what();
    const size_t end_of_tag = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && end_of_tag != std::string::npos) {
      what = what.substr(end_of_tag + 2);
    }
    DSV41_FAIL("config ", source, ": not valid JSON: ", what);
  }
}

// ---- serialization ----

struct JsonWriter {
  OrderedJson out = OrderedJson::object();
  template <typename T>
  void operator()(const char* key, const T& member, Need) {
    if constexpr (std::is_enum_v<T>) {
      const char* text = enum_name(member);
      out[key] = std::strcmp(text, "null") == 0 ? OrderedJson(nullptr) : OrderedJson(text);
    } else if constexpr (std::is_same_v<T, std::optional<int>>) {
      out[key] = member ? OrderedJson(*member) : OrderedJson(nullptr);
    } else {
      out[key] = member;
    }
  }
};

struct CanonicalWriter {
  std::string out;
  void value(int64_t v) { out += std::to_string(v); }
  void value(int v) { out += std::to_string(v); }
  void value(bool v) { out += v ? "true" : "false"; }
  void value(double v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016" PRIx64, std::bit_cast<uint64_t>(v));
    out += buf;
  }
  void value(const std::optional<int>& v) {
    if (v) value(*v); else out += "null";
  }
  template <typename T>
  void value(const std::vector<T>& v) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      value(v[i]);
    }
    out += ']';
  }
  template <typename E, typename = decltype(EnumNames<E>::kAll)>
  void value(E e) { out += enum_name(e); }

  template <typename T>
  void operator()(const char* key, const T& member, Need) {
    out += key;
    out += '=';
    value(member);
    out += ';';
  }
};

}  // namespace

const char* name(WeightDtype d) { return enum_name(d); }
const char* name(ExpertDtype d) { return enum_name(d); }
const char* name(ScoreFunc f) { return enum_name(f); }

ModelConfig parse_config(const std::string& json_text, const std::string& source) {
  const Json root = parse_json_text(json_text, source);
  if (!root.is_object()) {
    DSV41_FAIL("config ", source, ": the JSON root must be an object, got ", root.type_name());
  }
  check_known_keys(root, source);
  ModelConfig c;
  visit_fields(c, FieldReader(root, source));
  validate(c, source);
  return c;
}

ModelConfig load_config_file(const std::string& path) {
  // The input-file policy (base/input_file.h): a regular file only (a FIFO or /dev/zero is refused
  // at once), at most kMaxConfigBytes.
  const std::string text = input::read_text_file(path, "config file", input::kMaxConfigBytes);
  return parse_config(text, "file '" + path + "'");
}

std::vector<std::string> preset_names() { return {"tiny", "full"}; }

const std::string& preset_json(const std::string& name) {
  static const std::map<std::string, std::string> kPresets = {{"tiny", presets::kTinyJson},
                                                              {"full", presets::kFullJson}};
  const auto it = kPresets.find(name);
  if (it == kPresets.end()) DSV41_FAIL("unknown preset '", name, "' (presets: tiny, full)");
  return it->second;
}

ModelConfig load_config_preset(const std::string& name) {
  return parse_config(preset_json(name), "preset '" + name + "'");
}

ModelConfig load_config(const std::string& file_or_preset) {
  for (const std::string& p : preset_names()) {
    if (file_or_preset == p) return load_config_preset(p);
  }
  std::error_code ec;
  const bool looks_like_name = file_or_preset.find_first_of("/.") == std::string::npos;
  if (looks_like_name && !std::filesystem::exists(file_or_preset, ec)) {
    DSV41_FAIL("unknown preset '", file_or_preset,
               "' (presets: tiny, full) and no config file of that name");
  }
  return load_config_file(file_or_preset);
}

std::string to_json_string(const ModelConfig& c, int indent) {
  JsonWriter w;
  visit_fields(c, w);
  return w.out.dump(indent);
}

std::string config_hash(const ModelConfig& c) {
  CanonicalWriter w;
  visit_fields(c, w);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  for (const char ch : w.out) {
    h ^= static_cast<uint8_t>(ch);
    h *= 0x100000001b3ull;  // FNV-1a 64 prime
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

}  // namespace dsv41::reference
