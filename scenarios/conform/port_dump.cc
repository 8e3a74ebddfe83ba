// scenarios/conform/port_dump.cc: the port dump's keys and its writer (scenarios/conform/port_dump.h); the reader
// is port_dump_read.cc, the HDF5 container port_dump_h5.cc.
#include "scenarios/conform/port_dump.h"

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
#include <utility>

#include "formats/cache_format.h"
#include "base/error.h"
#include "base/output_file.h"
#include "reference/model/hooks.h"
#include "reports/h5_writer.h"
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/port_dump_internal.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/runner/backend.h"

namespace dsv41::scenarios::conform {

namespace fs = std::filesystem;
using reference::DType;
using reference::checkpoint::safetensors::Entry;
using json = nlohmann::json;

const reference::model::ComponentInfo& port_dump_detail::table_row(const std::string& component, const std::string& key) {
  const std::optional<reference::model::Component> id = reference::model::component_from_name(component);
  if (!id) DSV41_FAIL("key '", key, "': '", component, "' is not a component of reference/model/hooks.h");
  return reference::model::component_info(*id);
}

namespace {

using port_dump_detail::table_row;

constexpr const char* kCachePrefix = "cache.";
constexpr const char* kPositionsSuffix = ".positions";

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
  output::write_file_atomically(path, "port dump manifest", text.data(), text.size());
}
}  // namespace

std::string dump_key(int layer, const std::string& component) {
  if (layer < 0) return "model." + component;
  DSV41_CHECK(layer < 100, "port dump: layer ", layer, " needs more than two digits (version 1 keys: layerNN)");
  char buf[16];
  std::snprintf(buf, sizeof buf, "layer%02d.", layer);
  return buf + component;
}

std::string dump_step_group(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

std::string dump_step_file(int64_t step) { return dump_step_group(step) + ".safetensors"; }

bool is_h5_dump_path(const std::string& path) {
  return path.size() > 3 && path.compare(path.size() - 3, 3, ".h5") == 0;
}

DType dump_dtype(const std::string& component) {
  switch (table_row(component, component).type) {
    case reference::model::ComponentType::kBf16: return DType::kBF16;
    case reference::model::ComponentType::kFp32: return DType::kF32;
    case reference::model::ComponentType::kInt32: return DType::kI32;
    case reference::model::ComponentType::kInt64: return DType::kI64;
    case reference::model::ComponentType::kUint8:
    case reference::model::ComponentType::kBytes: return DType::kU8;
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
  if (is_h5_dump_path(dir_)) {
    if (fs::exists(dir_, ec)) {
      DSV41_FAIL("--dump '", dir_, "': exists (an HDF5 dump is written to a new file, so no stale dump is mistaken "
                 "for this one)");
    }
    h5_ = std::make_unique<reports::H5Writer>(dir_, "port dump (--dump)");  // <dir>.tmp.<pid>.<n> until finish()
    return;
  }
  if (fs::exists(dir_, ec)) {
    if (!fs::is_directory(dir_, ec)) DSV41_FAIL("--dump '", dir_, "': exists and is not a directory");
    if (!fs::is_empty(dir_, ec)) {
      DSV41_FAIL("--dump '", dir_, "': the directory is not empty (a dump is written into a new or empty "
                 "directory, so no stale step file is mistaken for part of it)");
    }
  }
  // The steps and the manifest go to a temp directory beside DIR, renamed onto DIR by finish():
  // DIR is absent (or stays empty) until the dump is complete, whatever kills the run.
  dir_out_ = std::make_unique<output::AtomicDirectory>(dir_, "port dump (--dump)");
}

// Not finished: an HDF5 dump's temp file is removed (H5Writer), a directory dump's temp directory
// too (AtomicDirectory); DIR itself was never touched.
PortDumpWriter::~PortDumpWriter() = default;

void PortDumpWriter::add_model_step(runner::StepCapture& cap, const reference::model::Model& model, const reference::model::ModelState& state,
                                    const reference::model::StepRecord& rec, const std::vector<int64_t>& tokens,
                                    const std::string& event, int64_t kept) {
  std::vector<reference::model::CacheView> caches = model.cache_views(state);
  for (std::vector<reference::model::CacheView> more :
       {reference::model::compressor_views(state, model.ops()), reference::model::dspark_views(state, model.ops())}) {
    for (reference::model::CacheView& v : more) caches.push_back(std::move(v));
  }
  finish_capture(cap, rec, std::move(caches));
  if (rec.all_logits.rank() == 2 && rec.all_logits.dim(0) == rec.tokens) {  // a verify step: every row
    cap.logits = rec.all_logits.data();
    cap.logit_rows = rec.tokens;
  }
  add_step(cap, tokens, event, kept);
  cap = runner::StepCapture{};
}

void PortDumpWriter::add_step(const runner::StepCapture& cap, const std::vector<int64_t>& tokens, const std::string& event,
                              int64_t kept, const std::vector<LaidOutCache>& laid_out) {
  PortDumpStep s;
  s.index = static_cast<int64_t>(steps_.size());
  s.start_pos = cap.start_pos;
  s.tokens = tokens;
  s.event = event;
  s.kept = kept < 0 ? static_cast<int64_t>(tokens.size()) : kept;
  DSV41_CHECK(static_cast<int64_t>(tokens.size()) == cap.tokens, "port dump: step ", s.index, " fed ",
              tokens.size(), " ids, its capture holds ", cap.tokens, " tokens");
  DSV41_CHECK(s.kept >= 1 && s.kept <= cap.tokens && (s.kept == cap.tokens || event == kPortDumpVerify),
              "port dump: step ", s.index, " (", event, ") keeps ", s.kept, " of its ", cap.tokens,
              " tokens (only a verify step keeps fewer)");
  if (!steps_.empty()) {
    const PortDumpStep& p = steps_.back();
    DSV41_CHECK(s.start_pos == p.start_pos + p.kept, "port dump: step ", s.index, " starts at position ", s.start_pos,
                ", the last step ended at ", p.start_pos + p.kept);
  }
  for (int64_t t = 0; t < cap.tokens; ++t) s.positions.push_back(cap.start_pos + t);

  std::vector<Entry> entries;
  std::map<std::string, std::vector<int>> present;
  std::set<std::string> keys;
  auto add = [&](int layer, const std::string& component, Entry e) {
    DSV41_CHECK(keys.insert(e.name).second, "port dump: step ", s.index, " records key '", e.name, "' twice");
    if (e.name.find(kPositionsSuffix) == std::string::npos && e.name.find(kBlockTableSuffix) == std::string::npos) {
      present[component].push_back(layer);
    }
    entries.push_back(std::move(e));
  };
  entries.push_back(int_entry("step.tokens", DType::kI64, {cap.tokens}, s.tokens));
  entries.push_back(int_entry("step.positions", DType::kI64, {cap.tokens}, s.positions));
  for (const runner::CapturedItem& it : cap.items) {
    const std::string key = dump_key(it.layer, it.component);
    const DType dt = dump_dtype(it.component);
    switch (it.kind) {
      case runner::CapturedItem::kFloat: add(it.layer, it.component, float_entry(key, dt, it.f.shape(), it.f.data())); break;
      case runner::CapturedItem::kIndex: add(it.layer, it.component, int_entry(key, dt, it.i.shape(), it.i.data())); break;
      case runner::CapturedItem::kMask: add(it.layer, it.component, int_entry(key, dt, it.m.shape(), it.m.data())); break;
      case runner::CapturedItem::kIds: add(it.layer, it.component, int_entry(key, dt, it.ids_shape, it.ids)); break;
    }
  }
  if (!cap.logits.empty()) {
    const std::string logits = reference::model::name(reference::model::Component::kLogits);
    add(-1, logits, float_entry(dump_key(-1, logits), DType::kF32,
                                {cap.logit_rows, static_cast<int64_t>(cap.logits.size()) / cap.logit_rows},
                                cap.logits));
  }
  std::map<std::string, std::string> meta = {{"format", kPortDumpFormat},
                                             {"version", std::to_string(kPortDumpVersion)},
                                             {"step", std::to_string(s.index)},
                                             {"start_pos", std::to_string(s.start_pos)},
                                             {"n_tokens", std::to_string(cap.tokens)},
                                             {"kept", std::to_string(s.kept)},
                                             {"event", event}};
  for (const reference::model::CacheView& v : cap.caches) {
    const std::string component = kCachePrefix + v.kind;
    const std::string key = dump_key(v.layer, component);
    add(v.layer, component, Entry{key, DType::kU8, {v.entries, v.entry_bytes}, v.bytes});
    if (static_cast<int64_t>(v.positions.size()) == v.entries) {
      add(v.layer, component, int_entry(key + kPositionsSuffix, DType::kI64, {v.entries}, v.positions));
    }
    meta[key + ".format"] = v.kind == "compressor" ? "fp32" : formats::info(v.format).name;  // fp32 rows: no CacheFormat
    meta[key + ".dim"] = std::to_string(v.dim);
  }
  for (const LaidOutCache& c : laid_out) {  // as the engine keeps it, checked as the reader reads it
    const std::string component = kCachePrefix + c.kind;
    const std::string key = dump_key(c.layer, component);
    table_row(component, key);
    DSV41_CHECK(c.meta.count("format") && c.meta.count("dim"), "port dump: step ", s.index, ": key '", key,
                "': a laid-out cache names its format and dim (LaidOutCache::meta)");
    std::map<std::string, Entry> read_back = {{key, Entry{key, DType::kU8, c.shape, c.bytes}}};
    for (const auto& [name, value] : c.meta) meta[key + "." + name] = value;
    if (!c.block_table.empty()) {
      Entry t = int_entry(key + kBlockTableSuffix, DType::kI32, {static_cast<int64_t>(c.block_table.size())}, c.block_table);
      read_back.emplace(t.name, t);
      add(c.layer, component, std::move(t));
    }
    canonicalize_cache(config_, meta, read_back, key, "port dump: step " + std::to_string(s.index));
    const int64_t entries = read_back.at(key).shape.at(0);
    add(c.layer, component, Entry{key, DType::kU8, c.shape, c.bytes});
    if (!c.positions.empty()) {
      DSV41_CHECK(static_cast<int64_t>(c.positions.size()) == entries, "port dump: step ", s.index, ": key '", key,
                  kPositionsSuffix, "': ", c.positions.size(), " positions for ", entries, " entries");
      add(c.layer, component, int_entry(key + kPositionsSuffix, DType::kI64, {entries}, c.positions));
    }
  }
  // Every step holds the same keys (version 1): the manifest promises them for every step.
  for (auto& [name, layers] : present) std::sort(layers.begin(), layers.end());
  if (steps_.empty()) {
    components_ = present;
  } else {
    DSV41_CHECK(present == components_, "port dump: step ", s.index,
                " holds other components or layers than step 0 (version 1 dumps hold the same keys in every step)");
  }
  if (h5_) {
    s.file = dump_step_group(s.index);
    port_dump_detail::write_h5_step(*h5_, s.file, entries, meta);
  } else {
    s.file = dump_step_file(s.index);
    reference::checkpoint::safetensors::write((fs::path(dir_out_->temp_path()) / s.file).string(), entries, meta);
  }
  steps_.push_back(std::move(s));
}

void PortDumpWriter::set_claim(const std::string& claim) {
  DSV41_CHECK(claim == kClaimBitExact || claim == kClaimOrderVariant, "port dump '", dir_, "': claim '", claim,
              "', expected '", kClaimBitExact, "' or '", kClaimOrderVariant, "'");
  claim_ = claim;
}

void PortDumpWriter::set_accumulation(const std::string& accumulation) {
  try {
    judge::accumulation_from_name(accumulation);
  } catch (const Error& e) {
    DSV41_FAIL("port dump '", dir_, "': ", e.what());
  }
  accumulation_ = accumulation;
}

void PortDumpWriter::set_backend(const std::string& backend) {
  DSV41_CHECK(backend_.empty() || backend_ == backend, "port dump '", dir_, "': steps of backend '", backend,
              "' after steps of backend '", backend_, "' (one dump, one backend)");
  const runner::Claim c = runner::backend_claim(backend);
  DSV41_CHECK(c != runner::Claim::kApproximate, "port dump '", dir_, "': backend '", backend,
              "' is approximate by design; a dump claims '", kClaimBitExact, "' or '", kClaimOrderVariant, "'");
  const std::string claim = c == runner::Claim::kOrderVariant ? kClaimOrderVariant : kClaimBitExact;
  DSV41_CHECK(claim_ != kClaimBitExact || claim == kClaimBitExact, "port dump '", dir_, "': claim '", claim_,
              "' was set, but backend '", backend, "' claims only '", claim, "' (runner::backend_claim)");
  if (claim_.empty()) claim_ = claim;  // an order-variant claim set before stays: a bit-exact backend meets it
  // The backend's accumulation (cuda: its fp8 linears on tensor cores), unless one was set.
  const judge::Accumulation acc = runner::backend_accumulation(backend);
  if (accumulation_.empty() && acc != judge::Accumulation::kFp32) accumulation_ = judge::name(acc);
  backend_ = backend;
}

void PortDumpWriter::prepare() {
  if (prepared_) return;
  json m;
  m["format"] = kPortDumpFormat;
  m["version"] = kPortDumpVersion;
  m["tool"] = tool_.empty() ? std::string("dsv41 ") + DSV41_VERSION_STRING : tool_;
  m["config_hash"] = reference::config_hash(config_);
  m["config"] = json::parse(reference::to_json_string(config_, -1));
  m["weights"] = weights_;
  m["token_map"] = token_map_;
  m["command_line"] = command_line_;
  m["claim"] = claim_.empty() ? kClaimBitExact : claim_;
  if (!accumulation_.empty()) m["accumulation"] = accumulation_;
  if (!backend_.empty()) m["backend"] = backend_;
  m["n_steps"] = steps_.size();
  json steps = json::array();
  for (const PortDumpStep& s : steps_) {
    steps.push_back({{"step", s.index}, {h5_ ? "group" : "file", s.file}, {"start_pos", s.start_pos},
                     {"n_tokens", s.tokens.size()}, {"kept", s.kept}, {"event", s.event}});
  }
  m["steps"] = steps;
  json comps = json::object();
  for (const auto& [name, layers] : components_) comps[name] = layers;
  m["components"] = comps;
  json absent = json::array();
  for (const reference::model::ComponentInfo& row : reference::model::component_table()) {
    if (!components_.count(row.name)) absent.push_back(row.name);
  }
  m["not_covered"] = absent;
  if (h5_) {
    port_dump_detail::write_h5_manifest(*h5_, m.dump(1) + "\n");
    h5_->close_file();
  } else {
    write_text_atomic((fs::path(dir_out_->temp_path()) / kPortDumpManifest).string(), m.dump(1) + "\n");
  }
  prepared_ = true;
}

void PortDumpWriter::finish() {
  prepare();
  if (h5_) {
    h5_->commit();
  } else {
    dir_out_->commit();
  }
}

}  // namespace dsv41::scenarios::conform
