#include "golden/golden_io.h"

#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "formats/error.h"

namespace dsv41::golden {
namespace {

static_assert(std::is_same_v<hid_t, int64_t>, "H5File stores hid_t as int64_t");

// Silences HDF5's automatic error-stack printing for one scope (the errors become exceptions).
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// Closes an HDF5 handle at scope exit.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

template <typename T>
struct TypeInfo;
template <>
struct TypeInfo<uint8_t> {
  static hid_t native() { return H5T_NATIVE_UINT8; }
  static constexpr const char* kName = "uint8";
};
template <>
struct TypeInfo<uint16_t> {
  static hid_t native() { return H5T_NATIVE_UINT16; }
  static constexpr const char* kName = "uint16";
};
template <>
struct TypeInfo<int32_t> {
  static hid_t native() { return H5T_NATIVE_INT32; }
  static constexpr const char* kName = "int32";
};
template <>
struct TypeInfo<int64_t> {
  static hid_t native() { return H5T_NATIVE_INT64; }
  static constexpr const char* kName = "int64";
};
template <>
struct TypeInfo<float> {
  static hid_t native() { return H5T_NATIVE_FLOAT; }
  static constexpr const char* kName = "float32";
};

// "uint16", "float64", ... for the stored type of a dataset.
std::string describe_type(hid_t type) {
  const size_t bits = 8 * H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT: return "float" + std::to_string(bits);
    default: return "a non-numeric type";
  }
}

template <typename T>
bool type_matches(hid_t type) {
  if (H5Tget_size(type) != sizeof(T)) return false;
  if constexpr (std::is_floating_point_v<T>) {
    return H5Tget_class(type) == H5T_FLOAT;
  } else {
    const bool is_unsigned = H5Tget_sign(type) == H5T_SGN_NONE;
    return H5Tget_class(type) == H5T_INTEGER && is_unsigned == std::is_unsigned_v<T>;
  }
}

}  // namespace

H5File::H5File(const std::string& path) : path_(path) {
  DSV41_CHECK(std::filesystem::is_regular_file(path), "golden file not found: ", path,
              " (regenerate with scripts/extract_golden.py)");
  const QuietErrors quiet;
  DSV41_CHECK(H5Fis_hdf5(path.c_str()) > 0, "not an HDF5 file: ", path);
  id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  DSV41_CHECK(id_ >= 0, "cannot open HDF5 file ", path);
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

bool H5File::has(const std::string& name) const {
  const QuietErrors quiet;
  std::string prefix;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t slash = std::min(name.find('/', start), name.size());
    prefix = name.substr(0, slash);
    const bool root = prefix.empty() || prefix == "/";
    if (!root && H5Lexists(id_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    start = slash + 1;
  }
  return !name.empty();
}

std::vector<std::string> H5File::children(const std::string& group) const {
  DSV41_CHECK(has(group), path_, ": group '", group, "' not found");
  const QuietErrors quiet;
  const Handle g(H5Gopen2(id_, group.c_str(), H5P_DEFAULT), H5Gclose);
  DSV41_CHECK(g.ok(), path_, ": '", group, "' is not a group");
  H5G_info_t info;
  DSV41_CHECK(H5Gget_info(g.get(), &info) >= 0, path_, ": cannot list group '", group, "'");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr,
                                           0, H5P_DEFAULT);
    DSV41_CHECK(len >= 0, path_, ": cannot list group '", group, "'");
    std::vector<char> buf(static_cast<size_t>(len) + 1);
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, buf.data(), buf.size(),
                       H5P_DEFAULT);
    names.emplace_back(buf.data(), static_cast<size_t>(len));
  }
  std::sort(names.begin(), names.end());
  return names;
}

template <typename T>
Array<T> H5File::read(const std::string& name, int rank) const {
  DSV41_CHECK(has(name), path_, ": dataset '", name, "' not found");
  const QuietErrors quiet;
  const Handle ds(H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose);
  DSV41_CHECK(ds.ok(), path_, ": '", name, "' is not a dataset");
  const Handle type(H5Dget_type(ds.get()), H5Tclose);
  DSV41_CHECK(type_matches<T>(type.get()), path_, ": dataset '", name, "' holds ",
              describe_type(type.get()), ", expected ", TypeInfo<T>::kName);
  const Handle space(H5Dget_space(ds.get()), H5Sclose);
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  DSV41_CHECK(ndims >= 0, path_, ": cannot read the shape of dataset '", name, "'");
  DSV41_CHECK(rank < 0 || ndims == rank, path_, ": dataset '", name, "' has rank ", ndims,
              ", expected ", rank);
  std::vector<hsize_t> dims(static_cast<size_t>(ndims));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  Array<T> out;
  size_t count = 1;
  for (const hsize_t d : dims) {
    out.shape.push_back(static_cast<int64_t>(d));
    count *= static_cast<size_t>(d);
  }
  out.data.resize(count);
  if (count > 0) {
    DSV41_CHECK(H5Dread(ds.get(), TypeInfo<T>::native(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        out.data.data()) >= 0,
                path_, ": cannot read dataset '", name, "'");
  }
  return out;
}

template Array<uint8_t> H5File::read<uint8_t>(const std::string&, int) const;
template Array<uint16_t> H5File::read<uint16_t>(const std::string&, int) const;
template Array<int32_t> H5File::read<int32_t>(const std::string&, int) const;
template Array<int64_t> H5File::read<int64_t>(const std::string&, int) const;
template Array<float> H5File::read<float>(const std::string&, int) const;

}  // namespace dsv41::golden
