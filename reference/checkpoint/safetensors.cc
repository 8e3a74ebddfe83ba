#include "base/json_limits.h"
#include "reference/checkpoint/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include <unistd.h>

#include "base/error.h"
#include "base/input_file.h"
#include "formats/minifloat.h"
#include "base/output_file.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference::checkpoint::safetensors {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit is 100 MB

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int64_t Entry::numel() const {
  // A zero extent anywhere makes the count 0 even after extents whose product overflows
  // ([2^40, 2^40, 0] is a valid empty tensor of read(): found by fuzz_safetensors under UBSan).
  for (int64_t s : shape) {
    if (s == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n)) {
      DSV41_FAIL("tensor '", name, "': shape ", shape_string(shape), " overflows 64 bits");
    }
  }
  return n;
}

std::vector<float> Entry::to_f32() const {
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* b = bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: {
        uint32_t u = uint32_t{b[4 * i]} | uint32_t{b[4 * i + 1]} << 8 |
                     uint32_t{b[4 * i + 2]} << 16 | uint32_t{b[4 * i + 3]} << 24;
        out[i] = dsv41::f32_from_bits(u);
        break;
      }
      case DType::kBF16: out[i] = formats::bf16_decode(b[2 * i] | uint32_t{b[2 * i + 1]} << 8); break;
      case DType::kF8E4M3: out[i] = formats::e4m3_decode(b[i]); break;
      case DType::kF8E8M0: out[i] = formats::e8m0_decode(b[i]); break;
      case DType::kF4: out[i] = formats::e2m1_decode((b[i / 2] >> ((i & 1) * 4)) & 0xF); break;
      case DType::kI32: {
        uint32_t u = uint32_t{b[4 * i]} | uint32_t{b[4 * i + 1]} << 8 |
                     uint32_t{b[4 * i + 2]} << 16 | uint32_t{b[4 * i + 3]} << 24;
        out[i] = static_cast<float>(static_cast<int32_t>(u));
        break;
      }
      case DType::kI64: {
        uint64_t u = read_le64(b + 8 * i);
        out[i] = static_cast<float>(static_cast<int64_t>(u));
        break;
      }
      case DType::kU8: out[i] = static_cast<float>(b[i]); break;
    }
  }
  return out;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  // The input-file policy (base/input_file.h): opened without blocking, a regular file only (a
  // FIFO given to --weights, a dump's step file or a vectors port file is refused at once).
  const input::InputFile in = input::InputFile::open(path, "weights file");
  const uint64_t file_size = in.size();
  input::check_memory(file_size, "weights file '" + path + "' (read whole)");
  if (file_size < 8) {
    DSV41_FAIL("weights file '", path, "' is ", file_size,
               " bytes: too short for a safetensors header (8-byte length first)");
  }
  unsigned char len_bytes[8];
  in.read_at(0, len_bytes, 8);
  const uint64_t header_len = read_le64(len_bytes);
  if (header_len > kMaxHeaderBytes) {
    DSV41_FAIL("weights file '", path, "': header length ", header_len, " bytes (", input::bytes_text(header_len),
               "), over the safetensors limit of ", kMaxHeaderBytes, " bytes (100 MiB)");
  }
  if (header_len > file_size - 8) {
    DSV41_FAIL("weights file '", path, "': header length ", header_len,
               " does not fit the file (", file_size, " bytes); not a safetensors file or truncated");
  }
  std::string header(header_len, '\0');
  if (header_len > 0) in.read_at(8, header.data(), header_len);
  const uint64_t data_size = file_size - 8 - header_len;

  // Parse, rejecting a duplicated top-level key (a tensor stored twice is ambiguous; nlohmann
  // would silently keep the last one).
  nlohmann::json j;
  std::set<std::string> top_keys;
  std::string duplicate;
  const nlohmann::json::parser_callback_t on_key = [&](int depth, nlohmann::json::parse_event_t event,
                                                       nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !top_keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  dsv41::check_json_nesting(header, "weights file '" + path + "': header");
  try {
    j = nlohmann::json::parse(header, on_key);
  } catch (const nlohmann::json::exception& e) {
    DSV41_FAIL("weights file '", path, "': header is not valid JSON: ", e.what());
  }
  if (!j.is_object()) DSV41_FAIL("weights file '", path, "': header is not a JSON object");
  if (!duplicate.empty()) DSV41_FAIL("weights file '", path, "': header names '", duplicate, "' twice");

  SafetensorsFile f;
  f.path_ = path;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto ctx = [&] { return "weights file '" + path + "', tensor '" + name + "'"; };
    if (name == "__metadata__") {
      if (!it->is_object()) DSV41_FAIL("weights file '", path, "': __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          DSV41_FAIL("weights file '", path, "': __metadata__ value of '", m.key(),
                     "' is not a string (", m->type_name(), ")");
        }
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = *it;
    if (!e.is_object()) DSV41_FAIL(ctx(), ": entry is not an object (", e.type_name(), ")");
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!e.contains(key)) DSV41_FAIL(ctx(), ": entry has no '", key, "'");
    }
    if (!e["dtype"].is_string()) DSV41_FAIL(ctx(), ": 'dtype' must be a string");
    if (!e["shape"].is_array()) DSV41_FAIL(ctx(), ": 'shape' must be an array");
    if (!e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      DSV41_FAIL(ctx(), ": 'data_offsets' must be [begin, end]");
    }
    Entry t;
    t.name = name;
    try {
      t.dtype = dsv41::reference::dtype_from_name(e["dtype"].get<std::string>());
    } catch (const Error& err) {
      DSV41_FAIL(ctx(), ": ", err.what());
    }
    // The element count, bounded so that it cannot overflow: no tensor holds more elements than
    // the data section has bytes x 2 (F4).
    const uint64_t max_numel = 2 * data_size + 2;
    uint64_t numel = 1;
    uint64_t nonzero_numel = 1;  // bounded too: a zero extent must not hide an overflowing product
    if (e["shape"].size() > 8) DSV41_FAIL(ctx(), ": shape has ", e["shape"].size(), " dimensions (at most 8)");
    for (const auto& s : e["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) {
        DSV41_FAIL(ctx(), ": shape entries must be non-negative integers, got ",
                   s.is_primitive() ? s.dump() : std::string(s.type_name()));
      }
      const uint64_t extent = s.get<uint64_t>();
      if (extent != 0 && extent > (uint64_t{1} << 62) / nonzero_numel) {
        DSV41_FAIL(ctx(), ": shape ", shape_string(t.shape), "... holds more than 2^62 elements");
      }
      if (extent != 0) nonzero_numel *= extent;
      t.shape.push_back(static_cast<int64_t>(extent));
      if (numel != 0 && extent > max_numel / numel) numel = max_numel + 1;  // saturate
      else numel *= extent;
    }
    for (const auto& o : e["data_offsets"]) {
      if (!o.is_number_unsigned()) DSV41_FAIL(ctx(), ": data_offsets must be non-negative integers");
    }
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
    const uint64_t end = e["data_offsets"][1].get<uint64_t>();
    if (begin > end || end > data_size) {
      DSV41_FAIL(ctx(), ": data_offsets [", begin, ", ", end, "] outside the data section of ", data_size,
                 " bytes (truncated file?)");
    }
    if (numel > max_numel) {
      DSV41_FAIL(ctx(), ": shape ", shape_string(t.shape), " holds more elements than the data section (",
                 data_size, " bytes) can store");
    }
    if (t.dtype == DType::kF4 && numel % 2 != 0) {
      DSV41_FAIL(ctx(), ": F4 tensor of shape ", shape_string(t.shape), " has an odd element count (", numel,
                 "); two E2M1 codes share a byte");
    }
    const uint64_t want = numel * static_cast<uint64_t>(dsv41::reference::dtype_bits(t.dtype)) / 8;
    if (end - begin != want) {
      DSV41_FAIL(ctx(), ": ", end - begin, " bytes stored, but ", dtype_name(t.dtype), " ",
                 shape_string(t.shape), " needs ", want);
    }
    t.bytes.resize(end - begin);
    if (end > begin) in.read_at(8 + header_len + begin, t.bytes.data(), end - begin);
    if (begin != end) ranges.push_back({begin, end, name});
    f.tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.name < b.name; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    if (b.begin < a.end) {
      DSV41_FAIL("weights file '", path, "': tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name,
                 "' [", b.begin, ", ", b.end, ") overlap in the data section");
    }
  }
  return f;
}

SafetensorsFile SafetensorsFile::from_entries(const std::string& label, std::vector<Entry> tensors,
                                              std::map<std::string, std::string> metadata) {
  SafetensorsFile f;
  f.path_ = label;
  f.metadata_ = std::move(metadata);
  for (Entry& t : tensors) {
    DSV41_CHECK(static_cast<int64_t>(t.bytes.size()) == stored_bytes(t.dtype, t.numel()), "'", label,
                "': tensor '", t.name, "' has ", t.bytes.size(), " bytes for ", dtype_name(t.dtype), " ",
                shape_string(t.shape));
    const std::string name = t.name;
    DSV41_CHECK(f.tensors_.emplace(name, std::move(t)).second, "'", label, "': duplicate tensor '", name, "'");
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

const Entry& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) DSV41_FAIL("weights file '", path_, "': missing tensor '", name, "'");
  return it->second;
}

const Entry& SafetensorsFile::get(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape) const {
  const Entry& t = get(name);
  if (t.dtype != dtype) {
    DSV41_FAIL("weights file '", path_, "': tensor '", name, "' has dtype ", dtype_name(t.dtype),
               ", expected ", dtype_name(dtype));
  }
  if (t.shape != shape) {
    DSV41_FAIL("weights file '", path_, "': tensor '", name, "' has shape ", shape_string(t.shape),
               ", expected ", shape_string(shape));
  }
  return t;
}

void write(const std::string& path, const std::vector<Entry>& tensors,
           const std::map<std::string, std::string>& metadata) {
  std::vector<const Entry*> sorted;
  std::set<std::string> seen;
  for (const Entry& t : tensors) {
    const auto ctx = [&] { return "writing '" + path + "': tensor '" + t.name + "'"; };
    if (t.name.empty() || t.name == "__metadata__") DSV41_FAIL(ctx(), ": reserved or empty name");
    if (!seen.insert(t.name).second) DSV41_FAIL(ctx(), ": name given twice");
    for (int64_t s : t.shape) {
      if (s < 0) DSV41_FAIL(ctx(), ": negative extent in shape ", shape_string(t.shape));
    }
    if (t.dtype == DType::kF4 && t.numel() % 2 != 0) {
      DSV41_FAIL(ctx(), ": F4 tensor of shape ", shape_string(t.shape), " has an odd element count");
    }
    if (static_cast<int64_t>(t.bytes.size()) != dsv41::reference::stored_bytes(t.dtype, t.numel())) {
      DSV41_FAIL(ctx(), ": ", t.bytes.size(), " bytes, but ", dtype_name(t.dtype), " ", shape_string(t.shape),
                 " needs ", stored_bytes(t.dtype, t.numel()));
    }
    sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Entry* t : sorted) {
    j[t->name] = {{"dtype", dsv41::reference::dtype_name(t->dtype)},
                  {"shape", t->shape},
                  {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  // Atomic (base/output_file.h): on any failure the target is left as it was.
  output::AtomicOutput out(path, "weights file");
  unsigned char len[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(len, 8);
  out.write(header.data(), header.size());
  for (const Entry* t : sorted) out.write(t->bytes.data(), t->bytes.size());
  out.commit();
}

}  // namespace dsv41::reference::checkpoint::safetensors
