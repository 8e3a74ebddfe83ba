// reports/h5_reader.h
//
// H5Reader: a read-only HDF5 file for the report reader and the schema check, built on the
// shared HDF5 layer (h5/h5_io.h). It answers what an object is, lists groups, reads
// attributes (strings, integers, floats, int64 arrays), 1-D datasets (strings, integers, floats)
// and the members of compound datasets, converting integer and float storage types to the
// requested C++ type the way HDF5 converts them.
//
// Contract: every failure (missing or non-HDF5 file, truncated or corrupt file, missing object or
// attribute, a type that does not convert) throws dsv41::Error "'<file>': <object>: <reason>".
// HDF5's automatic error-stack printing is off while the reader exists; the reader never aborts.
//
// Example:
//   H5Reader r("report.h5");
//   if (r.attr_type("/", "schema") == H5Reader::Type::kString) ... r.attr_string("/", "schema");
//   std::vector<double> v = r.read_doubles("/scenarios/x/comparisons/00/metrics/value");
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "h5/h5_io.h"

namespace dsv41::reports {

class H5Reader {
 public:
  // Opens path read-only.
  explicit H5Reader(std::string path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  const std::string& path() const { return path_; }

  enum class Kind { kMissing, kGroup, kDataset, kOther };
  // The type class of an attribute or a dataset (kNone: no such attribute).
  using Type = h5::Type;

  // What `object` ("/a/b") is; kMissing when a link on the way does not exist.
  Kind kind(const std::string& object) const;
  // The names of a group's members, sorted.
  std::vector<std::string> children(const std::string& group) const;

  Type attr_type(const std::string& object, const std::string& name) const;
  // The number of elements of an attribute (1 for a scalar).
  int64_t attr_size(const std::string& object, const std::string& name) const;
  std::string attr_string(const std::string& object, const std::string& name) const;  // fixed or variable length
  int64_t attr_int(const std::string& object, const std::string& name) const;         // integer types
  uint64_t attr_uint(const std::string& object, const std::string& name) const;       // integer types
  double attr_double(const std::string& object, const std::string& name) const;       // integer or float
  std::vector<int64_t> attr_ints(const std::string& object, const std::string& name) const;

  struct DatasetInfo {
    Type type = Type::kNone;
    std::vector<int64_t> dims;                         // [rank]
    int64_t element_bytes = 0;                         // stored size of one element
    std::vector<std::pair<std::string, Type>> fields;  // compound members, in order
  };
  DatasetInfo dataset_info(const std::string& path) const;

  // Whole datasets, any rank, row-major; the element type must convert (strings from strings,
  // integers from integers, doubles from integers or floats).
  std::vector<std::string> read_strings(const std::string& path) const;
  std::vector<int64_t> read_ints(const std::string& path) const;
  std::vector<uint64_t> read_uints(const std::string& path) const;
  std::vector<uint16_t> read_u16(const std::string& path) const;
  std::vector<double> read_doubles(const std::string& path) const;
  // A float32 dataset's values as stored (bit for bit, NaN payloads included); other types convert.
  std::vector<float> read_floats(const std::string& path) const;

  // One member of a 1-D compound dataset.
  std::vector<std::string> read_field_strings(const std::string& path, const std::string& field) const;
  std::vector<int64_t> read_field_ints(const std::string& path, const std::string& field) const;
  std::vector<double> read_field_doubles(const std::string& path, const std::string& field) const;

 private:
  std::string path_;
  h5::QuietErrors quiet_;  // for the reader's lifetime (restored after the file is closed)
  int64_t file_ = -1;      // hid_t
};

}  // namespace dsv41::reports
