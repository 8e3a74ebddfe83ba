// scenarios/conform/port_dump_read.cc: read_port_dump (scenarios/conform/port_dump.h): either container (a
// directory of safetensors files, or an HDF5 file: port_dump_h5.cc) read into the same StoredSteps,
// then validated the same way (docs/port-dump.md, "Validation").
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/json_keys.h"
#include "base/json_limits.h"
#include "base/error.h"
#include "base/input_file.h"
#include "base/json_context.h"
#include "reference/model/hooks.h"
#include "reference/ops/config.h"
#include "reports/h5_reader.h"
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/conform/port_dump_internal.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::scenarios::conform {

namespace fs = std::filesystem;
using port_dump_detail::StoredStep;
using port_dump_detail::table_row;
using reference::DType;
using reference::checkpoint::safetensors::Entry;
using json = nlohmann::json;

namespace {

constexpr const char* kPositionsSuffix = ".positions";

// The shape a component must have (the table's shape string with the config's sizes): -1 for a
// free dimension (N, k, entries, ...), -2 for "1 or T".
std::vector<int64_t> expected_shape(const reference::model::ComponentInfo& row, const reference::ModelConfig& c, int64_t t) {
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

// A top-k of `layer` at a step of T tokens from start_pos: the reference's width is
// min(index_topk, N), N = (start_pos + T) / ratio the layer's compressed positions after the step.
// The official code's padded form, [T, w] with min(index_topk, N) < w <= index_topk and -1 in every
// column beyond, is the same selection: its padding columns are dropped (docs/port-dump.md). Any
// other width is refused, naming the rule.
void unpad_topk(const reference::ModelConfig& c, int layer, int64_t start_pos, Entry& e, const std::string& where) {
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  if (layer < 0 || layer >= static_cast<int>(schedule.size()) || schedule[static_cast<size_t>(layer)].ratio <= 0 ||
      e.shape.size() != 2) {
    return;  // not a selecting layer: the replay says so (conform: present rows)
  }
  const int ratio = schedule[static_cast<size_t>(layer)].ratio;
  const int64_t t = e.shape[0], w = e.shape[1];
  const int64_t n = (start_pos + t) / ratio, want = std::min<int64_t>(c.index_topk, n);
  if (w == want) return;
  const std::string rule = "a top-k is [T, min(index_topk, N)] = [" + std::to_string(t) + ", " + std::to_string(want) +
                           "], N = (start_pos + T) / ratio = (" + std::to_string(start_pos) + " + " + std::to_string(t) +
                           ") / " + std::to_string(ratio) + " = " + std::to_string(n) + ", index_topk " +
                           std::to_string(c.index_topk) + "; or that padded with -1 up to [T, index_topk]";
  if (w < want || w > c.index_topk) {
    DSV41_FAIL(where, ": key '", e.name, "' has shape ", reference::shape_string(e.shape), ": ", rule);
  }
  std::vector<uint8_t> cut;
  cut.reserve(static_cast<size_t>(t * want * 4));
  for (int64_t r = 0; r < t; ++r) {
    const uint8_t* row = e.bytes.data() + r * w * 4;
    for (int64_t col = want; col < w; ++col) {
      int32_t x = 0;
      std::memcpy(&x, row + col * 4, 4);  // little-endian I32 (the hosts dsv41 runs on)
      if (x != -1) {
        DSV41_FAIL(where, ": key '", e.name, "' has shape ", reference::shape_string(e.shape), ", and row ", r,
                   " column ", col, " holds ", x, ", not the padding -1 (", rule, ")");
      }
    }
    cut.insert(cut.end(), row, row + want * 4);
  }
  e.bytes = std::move(cut);
  e.shape = {t, want};
}

// A manifest field, checked: a dsv41::Error naming the manifest and the field otherwise.
const json& field(const json& j, const std::string& name, const std::string& where) {
  if (!j.is_object() || !j.contains(name)) DSV41_FAIL(where, ": no '", name, "'");
  return j[name];
}

// A step file of the directory form as a StoredStep.
StoredStep read_step_file(const std::string& path, const std::string& where) {
  const reference::checkpoint::safetensors::SafetensorsFile f = [&] {
    try {
      return reference::checkpoint::safetensors::SafetensorsFile::read(path);
    } catch (const Error& e) {
      DSV41_FAIL(where, ": unreadable step file: ", e.what());
    }
  }();
  StoredStep st;
  st.metadata = f.metadata();
  for (const std::string& key : f.names()) st.tensors.emplace(key, f.get(key));
  return st;
}

// One step (a file or a group), validated against the manifest's promise and the component table.
void check_step(const PortDump& d, PortDumpStep& s, StoredStep st, const std::string& where) {
  s.metadata = std::move(st.metadata);
  auto contains = [&](const std::string& k) { return st.tensors.count(k) > 0; };
  auto get = [&](const std::string& k) -> const Entry& { return st.tensors.at(k); };
  auto meta = [&](const std::string& k) {
    const auto it = s.metadata.find(k);
    if (it == s.metadata.end()) DSV41_FAIL(where, ": the step's metadata has no '", k, "'");
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
  if (s.metadata.count("kept") && s.metadata["kept"] != std::to_string(s.kept)) {
    DSV41_FAIL(where, ": the file says kept ", s.metadata["kept"], ", the manifest ", s.kept);
  }
  const int64_t t = static_cast<int64_t>(s.positions.size());
  for (const char* k : {"step.tokens", "step.positions"}) {
    if (!contains(k)) DSV41_FAIL(where, ": missing key '", k, "'");
    const Entry& e = get(k);
    if (e.dtype != DType::kI64 || e.shape != std::vector<int64_t>{t}) {
      DSV41_FAIL(where, ": key '", k, "': ", reference::dtype_name(e.dtype), " ", reference::shape_string(e.shape),
                 ", expected I64 [", t, "] (n_tokens of the manifest)");
    }
  }
  const Entry& tok = get("step.tokens");
  const Entry& pos = get("step.positions");
  s.tokens.resize(static_cast<size_t>(t));
  std::memcpy(s.tokens.data(), tok.bytes.data(), tok.bytes.size());
  std::vector<int64_t> positions(static_cast<size_t>(t));
  std::memcpy(positions.data(), pos.bytes.data(), pos.bytes.size());
  if (positions != s.positions) DSV41_FAIL(where, ": key 'step.positions' is not start_pos, start_pos + 1, ...");

  // Every promised key is present, with the table's dtype and shape; a cache as its engine laid it
  // out is first turned into canonical entries (cache_layouts.h; its block table is consumed).
  std::set<std::string> promised = {"step.tokens", "step.positions"};
  for (const auto& [component, layers] : d.components) {
    for (int layer : layers) {
      const std::string key = dump_key(layer, component);
      promised.insert(key);
      if (!contains(key)) DSV41_FAIL(where, ": missing key '", key, "' (promised by ", kPortDumpManifest, ")");
      const reference::model::ComponentInfo& row = table_row(component, key);
      if (row.kind == reference::model::ComponentKind::kCache) {
        canonicalize_cache(d.config, s.metadata, st.tensors, key, where);
      }
      const Entry& e = get(key);
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
      if (row.kind == reference::model::ComponentKind::kCache && contains(key + kPositionsSuffix)) {
        const std::string pk = key + kPositionsSuffix;
        promised.insert(pk);
        const Entry& p = get(pk);
        if (p.dtype != DType::kI64 || p.shape != std::vector<int64_t>{e.shape[0]}) {
          DSV41_FAIL(where, ": key '", pk, "': ", reference::dtype_name(p.dtype), " ",
                     reference::shape_string(p.shape), ", expected I64 [", e.shape[0], "]");
        }
      }
    }
  }
  for (const auto& [key, e] : st.tensors) {
    if (!promised.count(key)) DSV41_FAIL(where, ": key '", key, "' is not listed in ", kPortDumpManifest);
  }
  const auto topk = d.components.find(reference::model::name(reference::model::Component::kTopk));
  if (topk != d.components.end()) {
    for (int layer : topk->second) {
      unpad_topk(d.config, layer, s.start_pos, st.tensors.at(dump_key(layer, topk->first)), where);
    }
  }
  for (const std::string& key : promised) s.tensors.emplace(key, std::move(st.tensors.at(key)));
}

}  // namespace

PortDump read_port_dump(const std::string& dir) {
  PortDump d;
  d.dir = dir;
  std::error_code ec;
  d.h5 = !fs::is_directory(dir, ec);
  if (d.h5 && !fs::exists(dir, ec)) {
    DSV41_FAIL("port dump '", dir, "': no such directory or file (a dump is a directory with ", kPortDumpManifest,
               ", or an HDF5 file)");
  }
  // The input-file policy (base/input_file.h): libhdf5 opens the path itself, so a FIFO or a device
  // is refused here, by stat, before it could block or read without end.
  if (d.h5) input::require_regular_file(dir, "port dump");
  // The HDF5 container: open for the whole read (the reader says why it cannot: not HDF5, truncated).
  std::unique_ptr<reports::H5Reader> h5;
  if (d.h5) {
    try {
      h5 = std::make_unique<reports::H5Reader>(dir);
    } catch (const Error& e) {
      DSV41_FAIL("port dump '", dir, "': not a directory, and not a readable HDF5 dump: ", e.what());
    }
  }
  const std::string mpath = d.h5 ? dir + ":/" + port_dump_detail::kH5ManifestAttr
                                 : (fs::path(dir) / kPortDumpManifest).string();
  const std::string where = "port dump '" + dir + "', " +
                            (d.h5 ? std::string("root attribute '") + port_dump_detail::kH5ManifestAttr + "'"
                                  : std::string(kPortDumpManifest));
  json m;
  if (d.h5) {
    const std::string text = port_dump_detail::read_h5_manifest(*h5, where);
    dsv41::check_json_nesting(text, where);
    try {
      m = dsv41::parse_json_without_duplicates(text, where);
    } catch (const json::exception& e) {
      DSV41_FAIL(where, ": not valid JSON: ", e.what());
    }
  } else {
    if (!fs::exists(mpath, ec)) DSV41_FAIL(where, ": missing manifest (cannot open '", mpath, "')");
    const std::string text = input::read_text_file(mpath, "port dump manifest", input::kMaxManifestBytes);
    dsv41::check_json_nesting(text, where);
    try {
      m = dsv41::parse_json_without_duplicates(text, where);
    } catch (const json::exception& e) {
      DSV41_FAIL(where, ": not valid JSON: ", e.what());
    }
  }
  try {
    if (field(m, "format", where) != kPortDumpFormat) {
      DSV41_FAIL(where, ": format '", field(m, "format", where).dump(), "', expected '", kPortDumpFormat, "'");
    }
    d.version = field(m, "version", where).get<int>();
    if (d.version < 1 || d.version > kPortDumpVersion || (d.h5 && d.version < 2)) {
      DSV41_FAIL(where, ": version ", d.version, ", this dsv41 reads versions 1 and ", kPortDumpVersion,
                 d.h5 ? " (HDF5 dumps: version 2)" : "");
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
    d.backend = m.value("backend", "");
    if (d.claim != kClaimBitExact && d.claim != kClaimOrderVariant) {
      DSV41_FAIL(where, ": claim '", d.claim, "', expected '", kClaimBitExact, "' or '", kClaimOrderVariant, "'");
    }
    d.accumulation = m.value("accumulation", std::string("fp32"));
    try {
      judge::accumulation_from_name(d.accumulation);
    } catch (const Error& e) {
      DSV41_FAIL(where, ": ", e.what());
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
    for (const reference::model::ComponentInfo& row : reference::model::component_table()) {
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
      const char* where_key = d.h5 ? "group" : "file";
      const std::string file = field(steps[k], where_key, sw).get<std::string>();
      const std::string want = d.h5 ? dump_step_group(s.index) : dump_step_file(s.index);
      s.kept = d.version >= 2 ? field(steps[k], "kept", sw).get<int64_t>() : t;
      if (s.index != static_cast<int64_t>(k)) {
        DSV41_FAIL(sw, " (", file, "): steps out of order: step ", s.index, " listed at index ", k);
      }
      if (file != want) DSV41_FAIL(sw, ": ", where_key, " '", file, "', expected '", want, "'");
      if (!d.steps.empty()) {
        const PortDumpStep& p = d.steps.back();
        const int64_t end = p.start_pos + p.kept;
        if (s.start_pos != end) {
          DSV41_FAIL(sw, " (", file, "): steps out of order: starts at position ", s.start_pos, ", step ", p.index,
                     " ended at ", end, p.kept < static_cast<int64_t>(p.positions.size()) ? " (its kept tokens)" : "");
        }
      }
      DSV41_CHECK(t >= 1, sw, ": n_tokens ", t);
      // Sizes checked before anything is allocated (issue 35): a step's positions lie in
      // [0, max_seq_len) of the dump's config, as the model requires of every forward.
      if (s.start_pos < 0 || s.start_pos > d.config.max_seq_len || t > d.config.max_seq_len - s.start_pos) {
        DSV41_FAIL(sw, " (", file, "): n_tokens ", t, " at start_pos ", s.start_pos, " reach past max_seq_len ",
                   d.config.max_seq_len, " of the dump's config (positions must lie in [0, max_seq_len))");
      }
      if (s.kept < 1 || s.kept > t || (s.kept < t && s.event != kPortDumpVerify)) {
        DSV41_FAIL(sw, " (", file, "): kept ", s.kept, " of n_tokens ", t, " (1 .. n_tokens; fewer than n_tokens only "
                   "for event '", kPortDumpVerify, "')");
      }
      for (int64_t i = 0; i < t; ++i) s.positions.push_back(s.start_pos + i);
      s.file = d.h5 ? dir + ":/" + file : (fs::path(dir) / file).string();
      d.steps.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    DSV41_FAIL(where, ": a field has the wrong type: ", json_reason(e));
  }
  for (PortDumpStep& s : d.steps) {
    const std::string where = "port dump '" + d.dir + "', " +
                              (d.h5 ? "group /" + dump_step_group(s.index) : s.file);
    check_step(d, s, d.h5 ? port_dump_detail::read_h5_step(*h5, dump_step_group(s.index), where)
                          : read_step_file(s.file, where), where);
  }
  return d;
}

}  // namespace dsv41::scenarios::conform
