// scenarios/conform/port_dump_h5.cc: the HDF5 container of the port dump (docs/port-dump.md, "The HDF5
// container"), on the project's HDF5 wrapper (reports/h5_writer.h, reports/h5_reader.h).
//
// A dataset per key, with the safetensors dtype in its "dtype" attribute and its values stored as
// HDF5's native little-endian type of the same width and class: BF16 as uint16 (the raw bits), F32
// as float32, I32 / I64 as int32 / int64, U8 as uint8. So a dataset's bytes are exactly the
// directory form's safetensors bytes.
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/json_keys.h"
#include "base/json_limits.h"
#include "base/error.h"
#include "reference/ops/dtype.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/conform/port_dump_internal.h"

namespace dsv41::scenarios::conform::port_dump_detail {

using reference::DType;
using reference::checkpoint::safetensors::Entry;
using Type = reports::H5Reader::Type;
using json = nlohmann::json;

namespace {

static_assert(std::endian::native == std::endian::little, "the port dump's bytes are little-endian");

// How a dtype is stored: its HDF5 type class and element size.
struct Storage {
  Type type;
  int64_t bytes;
};

Storage storage_of(dsv41::reference::DType d, const std::string& where) {
  switch (d) {
    case DType::kBF16: return {Type::kUInt, 2};
    case DType::kF32: return {Type::kFloat, 4};
    case DType::kI32: return {Type::kInt, 4};
    case DType::kI64: return {Type::kInt, 8};
    case DType::kU8: return {Type::kUInt, 1};
    default: DSV41_FAIL(where, ": dtype ", reference::dtype_name(d), " is not a port dump dtype (BF16, F32, I32, I64, U8)");
  }
}

template <typename T>
std::vector<T> values_of(const Entry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  std::memcpy(v.data(), e.bytes.data(), v.size() * sizeof(T));
  return v;
}

// The values read (as the wrapper's wide types) back as the entry's little-endian bytes.
template <typename T, typename Wide>
void put_bytes(Entry& e, const std::vector<Wide>& wide) {
  e.bytes.resize(wide.size() * sizeof(T));
  for (size_t i = 0; i < wide.size(); ++i) {
    const T x = static_cast<T>(wide[i]);
    std::memcpy(e.bytes.data() + i * sizeof(T), &x, sizeof(T));
  }
}

}  // namespace

void write_h5_step(reports::H5Writer& w, const std::string& group, const std::vector<Entry>& entries,
                   const std::map<std::string, std::string>& metadata) {
  const std::string g = "/" + group;
  w.group(g);
  for (const Entry& e : entries) {
    const std::string path = g + "/" + e.name;
    switch (e.dtype) {
      case DType::kBF16: w.write(path, values_of<uint16_t>(e), e.shape); break;
      case DType::kF32: w.write(path, values_of<float>(e), e.shape); break;
      case DType::kI32: w.write(path, values_of<int32_t>(e), e.shape); break;
      case DType::kI64: w.write(path, values_of<int64_t>(e), e.shape); break;
      case DType::kU8: w.write(path, e.bytes, e.shape); break;
      default: storage_of(e.dtype, "port dump '" + w.path() + "', " + path);
    }
    w.text_attr(path, kH5DtypeAttr, reference::dtype_name(e.dtype));
  }
  json m = json::object();
  for (const auto& [k, v] : metadata) m[k] = v;
  w.text_attr(g, kH5MetadataAttr, m.dump());
}

void write_h5_manifest(reports::H5Writer& w, const std::string& manifest_json) {
  w.text_attr("/", "format", kPortDumpFormat);
  w.attr("/", "version", static_cast<int64_t>(kPortDumpVersion));
  w.text_attr("/", kH5ManifestAttr, manifest_json);
}

std::string read_h5_manifest(const reports::H5Reader& r, const std::string& where) {
  if (r.attr_type("/", kH5ManifestAttr) != Type::kString) {
    DSV41_FAIL(where, ": missing manifest (no string attribute '", kH5ManifestAttr, "' on the root group)");
  }
  return r.attr_string("/", kH5ManifestAttr);
}

StoredStep read_h5_step(const reports::H5Reader& r, const std::string& group, const std::string& where) {
  const std::string g = "/" + group;
  if (r.kind(g) != reports::H5Reader::Kind::kGroup) DSV41_FAIL(where, ": missing group (the manifest lists it)");
  StoredStep s;
  if (r.attr_type(g, kH5MetadataAttr) != Type::kString) {
    DSV41_FAIL(where, ": no string attribute '", kH5MetadataAttr, "' (the step's metadata as a JSON object)");
  }
  const std::string metadata = r.attr_string(g, kH5MetadataAttr);
  dsv41::check_json_nesting(metadata, where + ": attribute '" + kH5MetadataAttr + "'");
  try {
    const json m = dsv41::parse_json_without_duplicates(metadata, where + ": attribute '" + kH5MetadataAttr + "'");
    if (!m.is_object()) DSV41_FAIL(where, ": attribute '", kH5MetadataAttr, "' is not a JSON object");
    for (const auto& [k, v] : m.items()) s.metadata[k] = v.get<std::string>();
  } catch (const json::exception& e) {
    DSV41_FAIL(where, ": attribute '", kH5MetadataAttr, "' is not a JSON object of strings: ", e.what());
  }
  for (const std::string& name : r.children(g)) {
    const std::string path = g + "/" + name;
    const std::string at = where + ": dataset '" + name + "'";
    if (r.kind(path) != reports::H5Reader::Kind::kDataset) DSV41_FAIL(at, ": not a dataset");
    if (r.attr_type(path, kH5DtypeAttr) != Type::kString) DSV41_FAIL(at, ": no string attribute '", kH5DtypeAttr, "'");
    Entry e;
    e.name = name;
    try {
      e.dtype = reference::dtype_from_name(r.attr_string(path, kH5DtypeAttr));
    } catch (const Error& x) {
      DSV41_FAIL(at, ": attribute '", kH5DtypeAttr, "': ", x.what());
    }
    const Storage want = storage_of(e.dtype, at);
    const reports::H5Reader::DatasetInfo info = r.dataset_info(path);
    if (info.type != want.type || info.element_bytes != want.bytes) {
      DSV41_FAIL(at, ": stored as ", h5::dtype_name(info.type, static_cast<size_t>(info.element_bytes)),
                 ", but dtype ", reference::dtype_name(e.dtype), " is stored as ",
                 h5::dtype_name(want.type, static_cast<size_t>(want.bytes)));
    }
    e.shape = info.dims;
    try {
      switch (e.dtype) {
        case DType::kBF16: put_bytes<uint16_t>(e, r.read_u16(path)); break;
        case DType::kF32: put_bytes<float>(e, r.read_floats(path)); break;
        case DType::kI32: put_bytes<int32_t>(e, r.read_ints(path)); break;
        case DType::kI64: put_bytes<int64_t>(e, r.read_ints(path)); break;
        default: put_bytes<uint8_t>(e, r.read_uints(path)); break;
      }
    } catch (const Error& x) {
      DSV41_FAIL(at, ": unreadable (truncated or corrupt file?): ", x.what());
    }
    s.tensors.emplace(name, std::move(e));
  }
  return s;
}

}  // namespace dsv41::scenarios::conform::port_dump_detail
