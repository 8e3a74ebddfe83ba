#include "reference/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "formats/error.h"
#include "formats/minifloat.h"

namespace dsv41::reference::safetensors {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int bits;  // per element
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 32},      {DType::kBF16, "BF16", 16}, {DType::kF8E4M3, "F8_E4M3", 8},
    {DType::kF8E8M0, "F8_E8M0", 8}, {DType::kF4, "F4", 4},      {DType::kI32, "I32", 32},
    {DType::kI64, "I64", 64},
};

const DTypeInfo& dinfo(DType d) { return kDTypes[static_cast<int>(d)]; }

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit is 100 MB

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* dtype_name(DType d) { return dinfo(d).name; }

DType dtype_from_name(const std::string& name) {
  for (const DTypeInfo& i : kDTypes) {
    if (name == i.name) return i.dtype;
  }
  DSV41_FAIL("unsupported safetensors dtype '", name,
             "' (supported: F32, BF16, F8_E4M3, F8_E8M0, F4, I32, I64)");
}

int64_t stored_bytes(DType d, int64_t numel) {
  const int bits = dinfo(d).bits;
  DSV41_CHECK(bits % 8 == 0 || numel % 2 == 0, "an F4 tensor needs an even element count, got ",
              numel);
  return numel * bits / 8;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<float> Tensor::to_f32() const {
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* b = bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: {
        uint32_t u = uint32_t{b[4 * i]} | uint32_t{b[4 * i + 1]} << 8 |
                     uint32_t{b[4 * i + 2]} << 16 | uint32_t{b[4 * i + 3]} << 24;
        out[i] = f32_from_bits(u);
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
    }
  }
  return out;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DSV41_FAIL("cannot open weights file '", path, "'");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) DSV41_FAIL("weights file '", path, "' is ", file_size, " bytes: too short for a safetensors header");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const uint64_t header_len = read_le64(len_bytes);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    DSV41_FAIL("weights file '", path, "': header length ", header_len,
               " does not fit the file (", file_size, " bytes); not a safetensors file or truncated");
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const uint64_t data_size = file_size - 8 - header_len;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    DSV41_FAIL("weights file '", path, "': header is not valid JSON: ", e.what());
  }
  if (!j.is_object()) DSV41_FAIL("weights file '", path, "': header is not a JSON object");

  SafetensorsFile f;
  f.path_ = path;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> range_names;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto ctx = [&] { return "weights file '" + path + "', tensor '" + name + "'"; };
    if (name == "__metadata__") {
      if (!it->is_object()) DSV41_FAIL("weights file '", path, "': __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) DSV41_FAIL("weights file '", path, "': __metadata__ value '", m.key(), "' is not a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
        !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      DSV41_FAIL(ctx(), ": entry needs dtype (string), shape (array) and data_offsets ([begin, end])");
    }
    Tensor t;
    t.name = name;
    try {
      t.dtype = dtype_from_name(e["dtype"].get<std::string>());
    } catch (const Error& err) {
      DSV41_FAIL(ctx(), ": ", err.what());
    }
    for (const auto& s : e["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) DSV41_FAIL(ctx(), ": shape entries must be non-negative integers");
      t.shape.push_back(s.get<int64_t>());
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
    if (t.dtype == DType::kF4 && t.numel() % 2 != 0) DSV41_FAIL(ctx(), ": F4 tensor with an odd element count");
    const int64_t want = stored_bytes(t.dtype, t.numel());
    if (static_cast<int64_t>(end - begin) != want) {
      DSV41_FAIL(ctx(), ": ", end - begin, " bytes stored, but ", dtype_name(t.dtype), " ",
                 shape_string(t.shape), " needs ", want);
    }
    t.bytes.resize(end - begin);
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    in.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(end - begin));
    if (!in) DSV41_FAIL(ctx(), ": read failed");
    ranges.emplace_back(begin, end);
    f.tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      DSV41_FAIL("weights file '", path, "': tensors overlap at byte ", ranges[i].first, " of the data section");
    }
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

const Tensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) DSV41_FAIL("weights file '", path_, "': missing tensor '", name, "'");
  return it->second;
}

const Tensor& SafetensorsFile::get(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape) const {
  const Tensor& t = get(name);
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

void write(const std::string& path, const std::vector<Tensor>& tensors,
           const std::map<std::string, std::string>& metadata) {
  std::vector<const Tensor*> sorted;
  std::set<std::string> seen;
  for (const Tensor& t : tensors) {
    DSV41_CHECK(seen.insert(t.name).second, "duplicate tensor name '", t.name, "'");
    DSV41_CHECK(static_cast<int64_t>(t.bytes.size()) == stored_bytes(t.dtype, t.numel()),
                "tensor '", t.name, "': ", t.bytes.size(), " bytes for ", dtype_name(t.dtype), " ",
                shape_string(t.shape));
    sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(), [](const Tensor* a, const Tensor* b) { return a->name < b->name; });
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Tensor* t : sorted) {
    j[t->name] = {{"dtype", dtype_name(t->dtype)},
                  {"shape", t->shape},
                  {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) DSV41_FAIL("cannot write '", tmp, "'");
    unsigned char len[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const Tensor* t : sorted) {
      out.write(reinterpret_cast<const char*>(t->bytes.data()), static_cast<std::streamsize>(t->bytes.size()));
    }
    out.flush();
    if (!out) DSV41_FAIL("writing '", tmp, "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    DSV41_FAIL("cannot move '", tmp, "' to '", path, "': ", ec.message());
  }
}

}  // namespace dsv41::reference::safetensors
