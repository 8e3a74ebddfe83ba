// h5/h5_io.h
//
// The one low-level HDF5 layer of dsv41 (library dsv41_h5, namespace dsv41::h5): the
// helpers every HDF5 reader and writer of the project needs, written once on the HDF5 C API.
//
//   QuietErrors         turns HDF5's automatic error-stack printing off for a scope
//   Handle              closes an HDF5 id at scope exit
//   open_read_only      opens an existing file, saying why when it cannot
//   path_exists         whether every link of "a/b/c" exists (a missing group is "absent")
//   member_names        the names of a group's members, sorted
//   Type, type_of       the type class of a stored type; type_class<T>, native_type<T> for C++ T
//   type_name           "a signed integer", ...; dtype_name "uint16", "float64", ...
//   space_dims          the extents of a dataspace; space_count its number of elements
//   vlen_utf8           a variable-length UTF-8 string type
//
// Why a target of its own, in reports/: golden/ (golden vectors, read by the tests) and reports/
// (forward outputs, the divergence report) both read HDF5, and the layering forbids golden to
// depend on reports' higher-level code (report.h and its schema) as much as reports to depend on
// golden. dsv41_h5 depends on HDF5 alone, so dsv41_golden and dsv41_reports both link it and
// neither sees the other. It sits in reports/ because HDF5 files are reports' business, and a
// helper library needs no top-level folder of its own; it is not part of dsv41_reports.
//
// Contract: this header does not include <hdf5.h>. An HDF5 id (hid_t) is an int64_t here and a
// close function an `int (*)(int64_t)` (h5_io.cc checks both against the HDF5 headers), so a
// header built on this layer stays free of HDF5 too. The functions never throw and never print:
// a failure is a negative id, false, std::nullopt or -1, and the caller throws a dsv41::Error
// with its own context (the file, the object, what it expected).
//
// Example:
//   OpenFailure why = OpenFailure::kNone;
//   const Handle file(open_read_only(path, &why), H5Fclose);
//   DSV41_CHECK(file.ok(), "cannot open ", path);
//   if (path_exists(file.get(), "quant/random/input/bits")) ...
//   const QuietErrors quiet;  // around raw HDF5 calls that may fail
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace dsv41::h5 {

using Id = int64_t;                    // hid_t
using CloseFn = int (*)(Id);           // H5Fclose, H5Dclose, H5Tclose, ...
using ErrorPrinter = int (*)(Id, void*);  // H5E_auto2_t

// Turns HDF5's automatic error-stack printing off for its lifetime and restores the caller's
// printer afterwards (the errors become exceptions or return values instead). Nests.
class QuietErrors {
 public:
  QuietErrors();
  ~QuietErrors();
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  ErrorPrinter func_ = nullptr;
  void* data_ = nullptr;
};

// Owns an HDF5 id and closes it with `close` (H5Dclose, H5Tclose, ...) at scope exit; an id < 0
// is never closed.
class Handle {
 public:
  Handle(Id id, CloseFn close) : id_(id), close_(close) {}
  ~Handle() { reset(-1); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  Id get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes the id held and holds `id` instead.
  void reset(Id id) {
    if (id_ >= 0) close_(id_);
    id_ = id;
  }

 private:
  Id id_;
  CloseFn close_;
};

// Why open_read_only failed.
enum class OpenFailure { kNone, kNoFile, kNotHdf5, kCannotOpen };

// Opens the existing HDF5 file `path` read-only: the file id, or -1 with *why saying what is
// wrong (no regular file there, not an HDF5 file, HDF5 cannot open it: truncated or corrupt).
Id open_read_only(const std::string& path, OpenFailure* why);

// True if every link of `path` ("a/b/c" or "/a/b/c") below `loc` exists, whatever the object
// is; "/" is the root and exists. False for "" and when a group on the way is missing (HDF5's
// H5Lexists fails on a missing intermediate group; this walks the prefixes instead).
bool path_exists(Id loc, const std::string& path);

// The names of the members of the open group `group`, sorted; nullopt when HDF5 cannot list it.
std::optional<std::vector<std::string>> member_names(Id group);

// The type class of a stored type (an attribute's or a dataset's), the way reports name them.
enum class Type { kNone, kString, kInt, kUInt, kFloat, kCompound, kOther };
Type type_of(Id type);
// "nothing", "a string", "a signed integer", "an unsigned integer", "a float", "a compound",
// "an unsupported type".
const char* type_name(Type t);
// The numpy-style name of a numeric type of `bytes` bytes: "int32", "uint16", "float64"; "a
// non-numeric type" for any other class.
std::string dtype_name(Type t, size_t bytes);

// The class a C++ arithmetic type is stored as.
template <typename T>
constexpr Type type_class() {
  static_assert(std::is_arithmetic_v<T>, "type_class: an arithmetic type");
  if constexpr (std::is_floating_point_v<T>) {
    return Type::kFloat;
  } else if constexpr (std::is_unsigned_v<T>) {
    return Type::kUInt;
  } else {
    return Type::kInt;
  }
}

// HDF5's native memory type for a number of class `t` (kInt, kUInt, kFloat) and `bytes` bytes
// (H5T_NATIVE_INT32, H5T_NATIVE_UINT16, H5T_NATIVE_DOUBLE, ...); -1 when there is none.
Id native_type(Type t, size_t bytes);
// The same for the C++ type T: native_type<float>() is H5T_NATIVE_FLOAT.
template <typename T>
Id native_type() {
  return native_type(type_class<T>(), sizeof(T));
}

// The extents of a simple dataspace ([rank]); nullopt when HDF5 cannot read them.
std::optional<std::vector<int64_t>> space_dims(Id space);
// The number of elements of a dataspace (1 for a scalar); -1 when HDF5 cannot tell.
int64_t space_count(Id space);

// A new variable-length UTF-8 string type (close it with H5Tclose).
Id vlen_utf8();

}  // namespace dsv41::h5
