#include "h5/h5_io.h"

#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace dsv41::h5 {

static_assert(std::is_same_v<hid_t, Id>, "h5::Id is hid_t");
static_assert(std::is_same_v<decltype(&H5Dclose), CloseFn>, "h5::CloseFn is herr_t (*)(hid_t)");
static_assert(std::is_same_v<H5E_auto2_t, ErrorPrinter>, "h5::ErrorPrinter is H5E_auto2_t");

QuietErrors::QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

QuietErrors::~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

Id open_read_only(const std::string& path, OpenFailure* why) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    *why = OpenFailure::kNoFile;
    return -1;
  }
  const QuietErrors quiet;
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    *why = OpenFailure::kNotHdf5;
    return -1;
  }
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  *why = file < 0 ? OpenFailure::kCannotOpen : OpenFailure::kNone;
  return file;
}

bool path_exists(Id loc, const std::string& path) {
  const QuietErrors quiet;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = std::min(path.find('/', start), path.size());
    const std::string prefix = path.substr(0, slash);
    const bool root = prefix.empty() || prefix == "/";
    if (!root && H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    start = slash + 1;
  }
  return !path.empty();
}

std::optional<std::vector<std::string>> member_names(Id group) {
  const QuietErrors quiet;
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) return std::nullopt;
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len =
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) return std::nullopt;
    std::vector<char> buf(static_cast<size_t>(len) + 1);
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, buf.data(), buf.size(), H5P_DEFAULT);
    names.emplace_back(buf.data(), static_cast<size_t>(len));
  }
  std::sort(names.begin(), names.end());
  return names;
}

Type type_of(Id type) {
  switch (H5Tget_class(type)) {
    case H5T_STRING: return Type::kString;
    case H5T_INTEGER: return H5Tget_sign(type) == H5T_SGN_NONE ? Type::kUInt : Type::kInt;
    case H5T_FLOAT: return Type::kFloat;
    case H5T_COMPOUND: return Type::kCompound;
    default: return Type::kOther;
  }
}

const char* type_name(Type t) {
  switch (t) {
    case Type::kNone: return "nothing";
    case Type::kString: return "a string";
    case Type::kInt: return "a signed integer";
    case Type::kUInt: return "an unsigned integer";
    case Type::kFloat: return "a float";
    case Type::kCompound: return "a compound";
    case Type::kOther: return "an unsupported type";
  }
  return "?";
}

std::string dtype_name(Type t, size_t bytes) {
  const std::string bits = std::to_string(8 * bytes);
  switch (t) {
    case Type::kInt: return "int" + bits;
    case Type::kUInt: return "uint" + bits;
    case Type::kFloat: return "float" + bits;
    default: return "a non-numeric type";
  }
}

Id native_type(Type t, size_t bytes) {
  if (t == Type::kFloat) {
    switch (bytes) {
      case 4: return H5T_NATIVE_FLOAT;
      case 8: return H5T_NATIVE_DOUBLE;
      default: return -1;
    }
  }
  if (t == Type::kInt) {
    switch (bytes) {
      case 1: return H5T_NATIVE_INT8;
      case 2: return H5T_NATIVE_INT16;
      case 4: return H5T_NATIVE_INT32;
      case 8: return H5T_NATIVE_INT64;
      default: return -1;
    }
  }
  if (t == Type::kUInt) {
    switch (bytes) {
      case 1: return H5T_NATIVE_UINT8;
      case 2: return H5T_NATIVE_UINT16;
      case 4: return H5T_NATIVE_UINT32;
      case 8: return H5T_NATIVE_UINT64;
      default: return -1;
    }
  }
  return -1;
}

std::optional<std::vector<int64_t>> space_dims(Id space) {
  const QuietErrors quiet;
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) return std::nullopt;
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) return std::nullopt;
  return std::vector<int64_t>(dims.begin(), dims.end());
}

int64_t space_count(Id space) {
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  return n < 0 ? -1 : static_cast<int64_t>(n);
}

Id vlen_utf8() {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  return type;
}

}  // namespace dsv41::h5
