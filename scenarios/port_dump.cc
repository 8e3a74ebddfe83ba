#include "scenarios/port_dump.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "formats/cache_format.h"
#include "formats/error.h"
#include "reference/hooks.h"

namespace dsv41::scenarios {

namespace fs = std::filesystem;
using reference::DType;
using reference::safetensors::Entry;
using json = nlohmann::json;

namespace {

constexpr const char* kCachePrefix = "cache.";
constexpr const char* kPositionsSuffix = ".positions";

// A component of the table, or a dsv41::Error naming the key.
const reference::ComponentInfo& table_row(const std::string& component, const std::string& key) {
  const std::optional<reference::Component> id = reference::component_from_name(component);
  if (!id) DSV41_FAIL("key '", key, "': '", component, "' is not a component of reference/hooks.h");
  return reference::component_info(*id);
}

template <typename T>
void append_le(std::vector<uint8_t>& out, T v) {
  for (size_t b = 0; b < sizeof(T); ++b) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * b)));
}

// bf16 values held in fp32 (exact: the low 16 bits are zero) -> BF16 bytes; fp32 -> F32 bytes.
Entry float_entry(const std::string& key, DType dtype, const std::vector<int64_t>& shape,
                  const std::vector<float>& values) {
  Entry e{key, dtype, shape, {}};
  e.bytes.reserve(values.size() * (dtype == DType::kBF16 ? 2 : 4));
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(values[i]);
    if (dtype == DType::kF32) {
      append_le(e.bytes, u);
      continue;
    }
    DSV41_CHECK((u & 0xFFFFu) == 0, "port dump: key '", key, "': element ", i, " (", values[i],
                ") is not a bf16 value, but the component is stored as BF16");
    append_le(e.bytes, static_cast<uint16_t>(u >> 16));
  }
  return e;
}

template <typename T>
Entry int_entry(const std::string& key, DType dtype, const std::vector<int64_t>& shape, const std::vector<T>& v) {
  Entry e{key, dtype, shape, {}};
  e.bytes.reserve(v.size() * sizeof(T));
  for (T x : v) append_le(e.bytes, x);
  return e;
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) DSV41_FAIL("port dump: cannot create '", tmp, "'");
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      DSV41_FAIL("port dump: writing '", tmp, "' failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    DSV41_FAIL("port dump: cannot rename '", tmp, "' to '", path, "': ", ec.message());
  }
}

// The shape a component must have (the table's shape string with the config's sizes): -1 for a
// free dimension (N, k, entries, ...), -2 for "1 or T".
std::vector<int64_t> expected_shape(const reference::ComponentInfo& row, const reference::ModelConfig& c, int64_t t) {
  std::string s = row.shape;
  s = s.substr(s.find('[') + 1);
  s = s.substr(0, s.find(']'));
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string d; std::getline(ss, d, ',');) {
    d.erase(0, d.find_first_not_of(' '));
    if (d == "T") out.push_back(t);
    else if (d == "1 or T") out.push_back(-2);
    else if (d == "hc") out.push_back(c.hc_mult);
    else if (d == "dim") out.push_back(c.dim);
    else if (d == "vocab") out.push_back(c.vocab_size);
    else if (d == "head_dim") out.push_back(c.head_dim);
    else if (d == "block") out.push_back(c.dspark_block_size);
    else if (!d.empty() && std::all_of(d.begin(), d.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      out.push_back(std::stoll(d));
    else out.push_back(-1);  // N, k, n_cols, entries, entry_bytes, pending, rank, 8 * dim
  }
  return out;
}

bool shape_fits(const std::vector<int64_t>& want, const std::vector<int64_t>& got, int64_t t) {
  if (want.size() != got.size()) return false;
  for (size_t d = 0; d < want.size(); ++d) {
    if (want[d] == -1) continue;
    if (want[d] == -2 ? (got[d] != 1 && got[d] != t) : got[d] != want[d]) return false;
  }
  return true;
}

std::string want_string(const std::vector<int64_t>& want) {
  std::string s = "[";
  for (size_t d = 0; d < want.size(); ++d) {
    s += d ? ", " : "";
    s += want[d] == -1 ? "any" : want[d] == -2 ? "1 or T" : std::to_string(want[d]);
  }
  return s + "]";
}

}  // namespace

std::string dump_key(int layer, const std::string& component) {
  if (layer < 0) return "model." + component;
  DSV41_CHECK(layer < 100, "port dump: layer ", layer, " needs more than two digits (version 1 keys: layerNN)");
  char buf[16];
  std::snprintf(buf, sizeof buf, "layer%02d.", layer);
  return buf + component;
}

std::string dump_step_file(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "step_%06lld.safetensors", static_cast<long long>(step));
  return buf;
}

DType dump_dtype(const std::string& component) {
  switch (table_row(component, component).type) {
    case reference::ComponentType::kBf16: return DType::kBF16;
    case reference::ComponentType::kFp32: return DType::kF32;
    case reference::ComponentType::kInt32: return DType::kI32;
    case reference::ComponentType::kInt64: return DType::kI64;
    case reference::ComponentType::kUint8:
    case reference::ComponentType::kBytes: return DType::kU8;
  }
  DSV41_FAIL("port dump: component '", component, "' has no storage dtype");
}

const Entry* PortDumpStep::find(int layer, const std::string& component) const {
  const auto it = tensors.find(dump_key(layer, component));
  return it == tensors.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// Writer.

PortDumpWriter::PortDumpWriter(std::string dir, const reference::ModelConfig& config, std::string weights,
                               std::string token_map, std::string command_line)
    : dir_(std::move(dir)),
      config_(config),
      weights_(std::move(weights)),
      token_map_(std::move(token_map)),
      command_line_(std::move(command_line)) {
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    if (!fs::is_directory(dir_, ec)) DSV41_FAIL("--dump '", dir_, "': exists and is not a directory");
    if (!fs::is_empty(dir_, ec)) {
      DSV41_FAIL("--dump '", dir_, "': the directory is not empty (a dump is written into a new or empty "
                 "directory, so no stale step file is mistaken for part of it)");
    }
  } else if (!fs::create_directories(dir_, ec) || ec) {
    DSV41_FAIL("--dump '", dir_, "': cannot create the directory: ", ec.message());
  }
}

void PortDumpWriter::add_model_step(StepCapture& cap, const reference::Model& model, const reference::ModelState& state,
                                    const reference::StepRecord& rec, const std::vector<int64_t>& tokens,
                                    const std::string& event) {
  std::vector<reference::CacheView> caches = model.cache_views(state);
  for (std::vector<reference::CacheView> more :
       {reference::compressor_views(state, model.ops()), reference::dspark_views(state, model.ops())}) {
    for (reference::CacheView& v : more) caches.push_back(std::move(v));
  }
  finish_capture(cap, rec, std::move(caches));
  add_step(cap, tokens, event);
  cap = StepCapture{};
}

void PortDumpWriter::add_step(const StepCapture& cap, const std::vector<int64_t>& tokens, const std::string& event) {
  PortDumpStep s;
  s.index = static_cast<int64_t>(steps_.size());
  s.start_pos = cap.start_pos;
  s.tokens = tokens;
  s.event = event;
  DSV41_CHECK(static_cast<int64_t>(tokens.size()) == cap.tokens, "port dump: step ", s.index, " fed ",
              tokens.size(), " ids, its capture holds ", cap.tokens, " tokens");
  if (!steps_.empty()) {
    const PortDumpStep& p = steps_.back();
    DSV41_CHECK(s.start_pos == p.start_pos + static_cast<int64_t>(p.tokens.size()), "port dump: step ", s.index,
                " starts at position ", s.start_pos, ", the last step ended at ",
                p.start_pos + static_cast<int64_t>(p.tokens.size()));
  }
  for (int64_t t = 0; t < cap.tokens; ++t) s.positions.push_back(cap.start_pos + t);

  std::vector<Entry> entries;
  std::map<std::string, std::vector<int>> present;
  std::set<std::string> keys;
  auto add = [&](int layer, const std::string& component, Entry e) {
    DSV41_CHECK(keys.insert(e.name).second, "port dump: step ", s.index, " records key '", e.name, "' twice");
    if (e.name.find(kPositionsSuffix) == std::string::npos) present[component].push_back(layer);
    entries.push_back(std::move(e));
  };
  entries.push_back(int_entry("step.tokens", DType::kI64, {cap.tokens}, s.tokens));
  entries.push_back(int_entry("step.positions", DType::kI64, {cap.tokens}, s.positions));
  for (const CapturedItem& it : cap.items) {
    const std::string key = dump_key(it.layer, it.component);
    const DType dt = dump_dtype(it.component);
    switch (it.kind) {
      case CapturedItem::kFloat: add(it.layer, it.component, float_entry(key, dt, it.f.shape(), it.f.data())); break;
      case CapturedItem::kIndex: add(it.layer, it.component, int_entry(key, dt, it.i.shape(), it.i.data())); break;
      case CapturedItem::kMask: add(it.layer, it.component, int_entry(key, dt, it.m.shape(), it.m.data())); break;
      case CapturedItem::kIds: add(it.layer, it.component, int_entry(key, dt, it.ids_shape, it.ids)); break;
    }
  }
  if (!cap.logits.empty()) {
    const std::string logits = reference::name(reference::Component::kLogits);
    add(-1, logits, float_entry(dump_key(-1, logits), DType::kF32,
                                {cap.logit_rows, static_cast<int64_t>(cap.logits.size()) / cap.logit_rows},
                                cap.logits));
  }
  std::map<std::string, std::string> meta = {{"format", kPortDumpFormat},
                                             {"version", std::to_string(kPortDumpVersion)},
                                             {"step", std::to_string(s.index)},
                                             {"start_pos", std::to_string(s.start_pos)},
                                             {"n_tokens", std::to_string(cap.tokens)},
                                             {"event", event}};
  for (const reference::CacheView& v : cap.caches) {
    const std::string component = kCachePrefix + v.kind;
    const std::string key = dump_key(v.layer, component);
    add(v.layer, component, Entry{key, DType::kU8, {v.entries, v.entry_bytes}, v.bytes});
    if (static_cast<int64_t>(v.positions.size()) == v.entries) {
      add(v.layer, component, int_entry(key + kPositionsSuffix, DType::kI64, {v.entries}, v.positions));
    }
    meta[key + ".format"] = formats::info(v.format).name;
    meta[key + ".dim"] = std::to_string(v.dim);
  }
  // Every step holds the same keys (version 1): the manifest promises them for every step.
  for (auto& [name, layers] : present) std::sort(layers.begin(), layers.end());
  if (steps_.empty()) {
    components_ = present;
  } else {
    DSV41_CHECK(present == components_, "port dump: step ", s.index,
                " holds other components or layers than step 0 (version 1 dumps hold the same keys in every step)");
  }
  s.file = dump_step_file(s.index);
  reference::safetensors::write((fs::path(dir_) / s.file).string(), entries, meta);
  steps_.push_back(std::move(s));
}

void PortDumpWriter::set_claim(const std::string& claim) {
  DSV41_CHECK(claim == kClaimBitExact || claim == kClaimOrderVariant, "port dump '", dir_, "': claim '", claim,
              "', expected '", kClaimBitExact, "' or '", kClaimOrderVariant, "'");
  claim_ = claim;
}

void PortDumpWriter::finish() {
  json m;
  m["format"] = kPortDumpFormat;
  m["version"] = kPortDumpVersion;
  m["tool"] = std::string("dsv41 ") + DSV41_VERSION_STRING;
  m["config_hash"] = reference::config_hash(config_);
  m["config"] = json::parse(reference::to_json_string(config_, -1));
  m["weights"] = weights_;
  m["token_map"] = token_map_;
  m["command_line"] = command_line_;
  m["claim"] = claim_.empty() ? kClaimBitExact : claim_;
  m["n_steps"] = steps_.size();
  json steps = json::array();
  for (const PortDumpStep& s : steps_) {
    steps.push_back({{"step", s.index}, {"file", s.file}, {"start_pos", s.start_pos},
                     {"n_tokens", s.tokens.size()}, {"event", s.event}});
  }
  m["steps"] = steps;
  json comps = json::object();
  for (const auto& [name, layers] : components_) comps[name] = layers;
  m["components"] = comps;
  json absent = json::array();
  for (const reference::ComponentInfo& row : reference::component_table()) {
    if (!components_.count(row.name)) absent.push_back(row.name);
  }
  m["not_covered"] = absent;
  write_text_atomic((fs::path(dir_) / kPortDumpManifest).string(), m.dump(1) + "\n");
}

// ---------------------------------------------------------------------------------------------
// Reader.

namespace {

// A manifest field, checked: a dsv41::Error naming the manifest and the field otherwise.
const json& field(const json& j, const std::string& name, const std::string& where) {
  if (!j.is_object() || !j.contains(name)) DSV41_FAIL(where, ": no '", name, "'");
  return j[name];
}

// One step file, validated against the manifest's promise and the component table.
void check_step(const PortDump& d, PortDumpStep& s) {
  const std::string where = "port dump '" + d.dir + "', " + s.file;
  const reference::safetensors::SafetensorsFile f = [&] {
    try {
      return reference::safetensors::SafetensorsFile::read(s.file);
    } catch (const Error& e) {
      DSV41_FAIL(where, ": unreadable step file: ", e.what());
    }
  }();
  s.metadata = f.metadata();
  auto meta = [&](const std::string& k) {
    const auto it = s.metadata.find(k);
    if (it == s.metadata.end()) DSV41_FAIL(where, ": __metadata__ has no '", k, "'");
    return it->second;
  };
  if (meta("step") != std::to_string(s.index)) {
    DSV41_FAIL(where, ": steps out of order: the file says step ", meta("step"), ", the manifest lists it as step ",
               s.index);
  }
  if (meta("start_pos") != std::to_string(s.start_pos)) {
    DSV41_FAIL(where, ": steps out of order: the file says start_pos ", meta("start_pos"), ", the manifest ",
               s.start_pos);
  }
  const int64_t t = static_cast<int64_t>(s.positions.size());
  for (const char* k : {"step.tokens", "step.positions"}) {
    if (!f.contains(k)) DSV41_FAIL(where, ": missing key '", k, "'");
    const Entry& e = f.get(k);
    if (e.dtype != DType::kI64 || e.shape != std::vector<int64_t>{t}) {
      DSV41_FAIL(where, ": key '", k, "': ", reference::dtype_name(e.dtype), " ", reference::shape_string(e.shape),
                 ", expected I64 [", t, "] (n_tokens of the manifest)");
    }
  }
  const Entry& tok = f.get("step.tokens");
  const Entry& pos = f.get("step.positions");
  s.tokens.resize(static_cast<size_t>(t));
  std::memcpy(s.tokens.data(), tok.bytes.data(), tok.bytes.size());
  std::vector<int64_t> positions(static_cast<size_t>(t));
  std::memcpy(positions.data(), pos.bytes.data(), pos.bytes.size());
  if (positions != s.positions) DSV41_FAIL(where, ": key 'step.positions' is not start_pos, start_pos + 1, ...");

  // Every promised key is present, with the table's dtype and shape.
  std::set<std::string> promised = {"step.tokens", "step.positions"};
  for (const auto& [component, layers] : d.components) {
    for (int layer : layers) {
      const std::string key = dump_key(layer, component);
      promised.insert(key);
      if (!f.contains(key)) DSV41_FAIL(where, ": missing key '", key, "' (promised by ", kPortDumpManifest, ")");
      const Entry& e = f.get(key);
      const reference::ComponentInfo& row = table_row(component, key);
      const DType want = dump_dtype(component);
      if (e.dtype != want) {
        DSV41_FAIL(where, ": key '", key, "' has dtype ", reference::dtype_name(e.dtype), ", expected ",
                   reference::dtype_name(want), " (component '", component, "')");
      }
      const std::vector<int64_t> shape = expected_shape(row, d.config, t);
      if (!shape_fits(shape, e.shape, t)) {
        DSV41_FAIL(where, ": key '", key, "' has shape ", reference::shape_string(e.shape), ", expected ",
                   want_string(shape), " (component '", component, "' ", row.shape, ", T = ", t, ")");
      }
      if (row.kind == reference::ComponentKind::kCache && f.contains(key + kPositionsSuffix)) {
        const std::string pk = key + kPositionsSuffix;
        promised.insert(pk);
        const Entry& p = f.get(pk);
        if (p.dtype != DType::kI64 || p.shape != std::vector<int64_t>{e.shape[0]}) {
          DSV41_FAIL(where, ": key '", pk, "': ", reference::dtype_name(p.dtype), " ",
                     reference::shape_string(p.shape), ", expected I64 [", e.shape[0], "]");
        }
      }
    }
  }
  for (const std::string& key : f.names()) {
    if (!promised.count(key)) DSV41_FAIL(where, ": key '", key, "' is not listed in ", kPortDumpManifest);
  }
  for (const std::string& key : promised) s.tensors.emplace(key, f.get(key));
}

}  // namespace

PortDump read_port_dump(const std::string& dir) {
  PortDump d;
  d.dir = dir;
  const std::string mpath = (fs::path(dir) / kPortDumpManifest).string();
  const std::string where = "port dump '" + dir + "', " + kPortDumpManifest;
  std::ifstream in(mpath, std::ios::binary);
  if (!in) DSV41_FAIL(where, ": missing manifest (cannot open '", mpath, "')");
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    DSV41_FAIL(where, ": not valid JSON: ", e.what());
  }
  try {
    if (field(m, "format", where) != kPortDumpFormat) {
      DSV41_FAIL(where, ": format '", field(m, "format", where).dump(), "', expected '", kPortDumpFormat, "'");
    }
    d.version = field(m, "version", where).get<int>();
    if (d.version != kPortDumpVersion) {
      DSV41_FAIL(where, ": version ", d.version, ", this dsv41 reads version ", kPortDumpVersion);
    }
    d.config_hash = field(m, "config_hash", where).get<std::string>();
    d.config = reference::parse_config(field(m, "config", where).dump(), mpath + " (config)");
    if (reference::config_hash(d.config) != d.config_hash) {
      DSV41_FAIL(where, ": config_hash ", d.config_hash, " is not the hash of its config (",
                 reference::config_hash(d.config), ")");
    }
    d.tool = m.value("tool", "");
    d.weights = m.value("weights", "");
    d.token_map = m.value("token_map", "");
    d.command_line = m.value("command_line", "");
    d.claim = m.value("claim", std::string(kClaimBitExact));
    if (d.claim != kClaimBitExact && d.claim != kClaimOrderVariant) {
      DSV41_FAIL(where, ": claim '", d.claim, "', expected '", kClaimBitExact, "' or '", kClaimOrderVariant, "'");
    }
    for (const auto& [name, layers] : field(m, "components", where).items()) {
      table_row(name, name);
      for (const json& l : layers) {
        const int layer = l.get<int>();
        DSV41_CHECK(layer >= -1 && layer < 100, where, ": component '", name, "' at layer ", layer,
                    " (version 1 keys: model. or layer00 .. layer99)");
        d.components[name].push_back(layer);
      }
    }
    for (const reference::ComponentInfo& row : reference::component_table()) {
      if (!d.components.count(row.name)) d.not_covered.push_back(row.name);
    }
    const json& steps = field(m, "steps", where);
    const int64_t n = field(m, "n_steps", where).get<int64_t>();
    if (!steps.is_array() || static_cast<int64_t>(steps.size()) != n) {
      DSV41_FAIL(where, ": n_steps ", n, ", but 'steps' lists ", steps.is_array() ? steps.size() : 0);
    }
    for (size_t k = 0; k < steps.size(); ++k) {
      const std::string sw = where + ", steps[" + std::to_string(k) + "]";
      PortDumpStep s;
      s.index = field(steps[k], "step", sw).get<int64_t>();
      s.start_pos = field(steps[k], "start_pos", sw).get<int64_t>();
      s.event = field(steps[k], "event", sw).get<std::string>();
      const int64_t t = field(steps[k], "n_tokens", sw).get<int64_t>();
      const std::string file = field(steps[k], "file", sw).get<std::string>();
      if (s.index != static_cast<int64_t>(k)) {
        DSV41_FAIL(sw, " (", file, "): steps out of order: step ", s.index, " listed at index ", k);
      }
      if (file != dump_step_file(s.index)) DSV41_FAIL(sw, ": file '", file, "', expected '", dump_step_file(s.index), "'");
      if (!d.steps.empty()) {
        const PortDumpStep& p = d.steps.back();
        const int64_t end = p.start_pos + static_cast<int64_t>(p.positions.size());
        if (s.start_pos != end) {
          DSV41_FAIL(sw, " (", file, "): steps out of order: starts at position ", s.start_pos, ", step ", p.index,
                     " ended at ", end);
        }
      }
      DSV41_CHECK(t >= 1, sw, ": n_tokens ", t);
      for (int64_t i = 0; i < t; ++i) s.positions.push_back(s.start_pos + i);
      s.file = (fs::path(dir) / file).string();
      d.steps.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    DSV41_FAIL(where, ": a field has the wrong type: ", e.what());
  }
  for (PortDumpStep& s : d.steps) check_step(d, s);
  return d;
}

}  // namespace dsv41::scenarios
