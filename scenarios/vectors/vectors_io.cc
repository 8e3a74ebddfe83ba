// scenarios/vectors/vectors_io.cc
//
// The conformance vector set on disk (scenarios/vectors/vectors.h, docs/port-dump.md): the sizes and their
// configs, a case's metadata, the set writer (case files, then vectors.json) and reader, and the
// tensor / parameter helpers of vectors_internal.h.
#include <cerrno>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "base/data_dir.h"
#include "base/json_keys.h"
#include "base/json_limits.h"
#include "base/error.h"
#include "base/input_file.h"
#include "base/json_context.h"
#include "base/output_file.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/vectors/vectors.h"
#include "scenarios/vectors/vectors_internal.h"

namespace dsv41::scenarios::vectors {

namespace fs = std::filesystem;
namespace st = reference::checkpoint::safetensors;
using json = nlohmann::json;
using reference::DType;
using reference::Tensor;

namespace vectors_detail {

namespace {

template <typename T>
st::Entry raw_entry(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const std::vector<T>& v) {
  st::Entry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = shape;
  e.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(e.bytes.data(), v.data(), e.bytes.size());  // little-endian host
  return e;
}

template <typename T>
std::vector<T> raw_values(const st::SafetensorsFile& f, const std::string& key, DType dtype) {
  DSV41_CHECK(f.contains(key), f.path(), ": no tensor '", key, "'");
  const st::Entry& e = f.get(key);
  DSV41_CHECK(e.dtype == dtype, f.path(), ": tensor '", key, "' is ", reference::dtype_name(e.dtype), ", expected ",
              reference::dtype_name(dtype));
  std::vector<T> v(e.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return v;
}

}  // namespace

st::Entry f32_entry(const std::string& name, const Tensor<float>& t) {
  return raw_entry(name, DType::kF32, t.shape(), t.data());
}
st::Entry i32_entry(const std::string& name, const Tensor<int32_t>& t) {
  return raw_entry(name, DType::kI32, t.shape(), t.data());
}
st::Entry i64_entry(const std::string& name, const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  return raw_entry(name, DType::kI64, shape, v);
}
st::Entry u8_entry(const std::string& name, const Tensor<uint8_t>& t) {
  return raw_entry(name, DType::kU8, t.shape(), t.data());
}

Tensor<float> get_f32(const st::SafetensorsFile& f, const std::string& key) {
  return Tensor<float>(f.contains(key) ? f.get(key).shape : std::vector<int64_t>{}, raw_values<float>(f, key, DType::kF32),
                       key);
}
Tensor<int32_t> get_i32(const st::SafetensorsFile& f, const std::string& key) {
  return Tensor<int32_t>(f.contains(key) ? f.get(key).shape : std::vector<int64_t>{},
                         raw_values<int32_t>(f, key, DType::kI32), key);
}
std::vector<int64_t> get_i64(const st::SafetensorsFile& f, const std::string& key) {
  return raw_values<int64_t>(f, key, DType::kI64);
}
Tensor<uint8_t> get_u8(const st::SafetensorsFile& f, const std::string& key) {
  return Tensor<uint8_t>(f.contains(key) ? f.get(key).shape : std::vector<int64_t>{},
                         raw_values<uint8_t>(f, key, DType::kU8), key);
}

reference::LinearWeight get_linear(const st::SafetensorsFile& f, const std::string& prefix) {
  const std::string key = prefix + ".weight";
  DSV41_CHECK(f.contains(key), f.path(), ": no tensor '", key, "'");
  const st::Entry& w = f.get(key);
  DSV41_CHECK(w.shape.size() == 2, f.path(), ": tensor '", key, "' has rank ", w.shape.size(), ", expected [out, in]");
  reference::LinearWeight lw = reference::checkpoint::load_linear(f, prefix, w.dtype, w.shape[0], w.shape[1]);
  lw.name = prefix;
  return lw;
}

std::string param(const st::SafetensorsFile& f, const std::string& key) {
  const auto it = f.metadata().find("param." + key);
  DSV41_CHECK(it != f.metadata().end(), f.path(), ": __metadata__ has no 'param.", key, "'");
  return it->second;
}

int64_t param_int(const st::SafetensorsFile& f, const std::string& key) {
  const std::string s = param(f, key);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  DSV41_CHECK(!s.empty() && *end == '\0', f.path(), ": __metadata__ 'param.", key, "' = '", s, "' is not an integer");
  // Every op parameter is a 32-bit int of the reference (a dim, a count, a position): range-checked
  // here, before any caller narrows it (issue 35: ratio=2**32+2 ran as ratio 2).
  constexpr long long kLo = std::numeric_limits<int32_t>::min(), kHi = std::numeric_limits<int32_t>::max();
  if (errno == ERANGE || v < kLo || v > kHi) {
    DSV41_FAIL(f.path(), ": parameter '", key, "' = ", s, " is out of range (", kLo, " .. ", kHi, ")");
  }
  return v;
}

double param_real(const st::SafetensorsFile& f, const std::string& key) {
  const std::string s = param(f, key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  DSV41_CHECK(!s.empty() && *end == '\0', f.path(), ": __metadata__ 'param.", key, "' = '", s, "' is not a number");
  return v;
}

reference::ModelConfig case_config(const st::SafetensorsFile& f) {
  const auto it = f.metadata().find("config");
  DSV41_CHECK(it != f.metadata().end(), f.path(), ": __metadata__ has no 'config'");
  return reference::parse_config(it->second, f.path() + " __metadata__ 'config'");
}

std::string real_string(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

}  // namespace vectors_detail

const std::vector<std::string>& vector_sizes() {
  static const std::vector<std::string> s = {"tiny", "small", "released"};
  return s;
}

reference::ModelConfig vector_size_config(const std::string& size) {
  if (size == "tiny") return reference::load_config_preset("tiny");
  if (size == "small") return reference::load_config_file(dsv41::data::file("scenarios/configs/small.json"));
  if (size == "released") return reference::load_config_preset("full");
  DSV41_FAIL("vectors: unknown size '", size, "' (tiny, small, released)");
}

std::map<std::string, std::string> vector_metadata(const VectorCase& c) {
  std::map<std::string, std::string> m = {{"format", kVectorsFormat},
                                          {"version", std::to_string(kVectorsVersion)},
                                          {"case", c.name},
                                          {"op", c.op},
                                          {"size", c.size},
                                          {"seed", std::to_string(c.seed)},
                                          {"description", c.description},
                                          {"adversarial", c.adversarial},
                                          {"tolerance", vectors_detail::real_string(c.tolerance)},
                                          {"tolerance_origin", c.tolerance_origin},
                                          {"config", reference::to_json_string(vector_size_config(c.size), -1)}};
  for (const auto& [k, v] : c.params) m["param." + k] = v;
  return m;
}

VectorSetSummary write_vector_set(const std::string& dir, const std::vector<std::string>& sizes, uint64_t seed,
                                  const std::string& command_line) {
  for (const std::string& s : sizes) vector_size_config(s);  // refuse an unknown size before writing
  if (fs::exists(dir)) {
    DSV41_CHECK(fs::is_directory(dir) && fs::is_empty(dir), "vectors: '", dir, "' exists and is not an empty directory");
  }
  // Written as one (output::AtomicDirectory): `dir` stays absent or empty until the set is complete.
  output::AtomicDirectory out(dir, "vectors");
  VectorSetSummary sum;
  json cases = json::array();
  for (const std::string& size : sizes) {
    for (const VectorCase& c : make_vector_cases(size, seed)) {
      const std::string file = c.name + ".safetensors";
      const fs::path path = fs::path(out.temp_path()) / file;
      st::write(path.string(), c.tensors, vector_metadata(c));
      sum.bytes += static_cast<int64_t>(fs::file_size(path));
      ++sum.cases;
      cases.push_back({{"name", c.name}, {"op", c.op}, {"size", c.size}, {"file", file}, {"seed", c.seed},
                       {"adversarial", c.adversarial}, {"tolerance", c.tolerance},
                       {"tolerance_origin", c.tolerance_origin}});
    }
  }
  const json manifest = {{"format", kVectorsFormat},
                         {"version", kVectorsVersion},
                         {"tool", std::string("dsv41 ") + DSV41_VERSION_STRING},
                         {"git_commit", DSV41_GIT_COMMIT_STRING},
                         {"command_line", command_line},
                         {"seed", seed},
                         {"sizes", sizes},
                         {"n_cases", sum.cases},
                         {"cases", cases}};
  const fs::path path = fs::path(out.temp_path()) / kVectorsManifest;
  const std::string text = manifest.dump(2) + "\n";
  output::write_file_atomically(path.string(), "vectors manifest", text.data(), text.size());
  out.commit();
  return sum;
}

namespace {

VectorSet read_vector_set_fields(const std::string& dir) {
  const fs::path path = fs::path(dir) / kVectorsManifest;
  const std::string where = path.string();
  DSV41_CHECK(fs::exists(path), where, ": no such file (not a conformance vector set: dsv41 vectors -o DIR)");
  const std::string text = input::read_text_file(where, "vectors manifest", input::kMaxManifestBytes);
  dsv41::check_json_nesting(text, where);
  json j;
  try {
    j = dsv41::parse_json_without_duplicates(text, where);
  } catch (const std::exception& e) {
    DSV41_FAIL(where, ": not JSON: ", e.what());
  }
  const auto str = [&](const json& o, const std::string& key, const std::string& ctx) -> std::string {
    DSV41_CHECK(o.is_object() && o.contains(key) && o[key].is_string(), where, ": ", ctx, "'", key,
                "' is missing or not a string");
    return o[key].get<std::string>();
  };
  DSV41_CHECK(str(j, "format", "") == kVectorsFormat, where, ": 'format' is '", j["format"].get<std::string>(),
              "', expected '", kVectorsFormat, "'");
  DSV41_CHECK(j.contains("version") && j["version"].is_number_integer() && j["version"].get<int>() == kVectorsVersion,
              where, ": 'version' must be ", kVectorsVersion);
  DSV41_CHECK(j.contains("cases") && j["cases"].is_array(), where, ": 'cases' is missing or not a list");
  VectorSet s;
  s.dir = dir;
  s.tool = typed_value(j, "tool", std::string(), where);
  s.git_commit = typed_value(j, "git_commit", std::string(), where);
  s.seed = typed_value(j, "seed", uint64_t{0}, where);
  for (size_t i = 0; i < j["cases"].size(); ++i) {
    const json& c = j["cases"][i];
    const std::string ctx = "cases[" + std::to_string(i) + "].";
    VectorSetEntry e{str(c, "name", ctx), str(c, "op", ctx), str(c, "size", ctx), str(c, "file", ctx),
                     typed_value(c, "adversarial", std::string(), where + ": " + ctx)};
    DSV41_CHECK(e.file.find('/') == std::string::npos && fs::exists(fs::path(dir) / e.file), where, ": ", ctx,
                "file '", e.file, "' is missing from the set");
    s.cases.push_back(std::move(e));
  }
  return s;
}

}  // namespace

VectorSet read_vector_set(const std::string& dir) {
  // A field of the wrong type names the file (base/json_context.h), not "[json.exception...]".
  return json_context((fs::path(dir) / kVectorsManifest).string(), [&] { return read_vector_set_fields(dir); });
}

}  // namespace dsv41::scenarios::vectors
