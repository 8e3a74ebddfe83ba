// golden/golden_io.h
//
// Reads golden vectors: HDF5 datasets into host arrays, on the shared HDF5 layer h5/h5_io.h
// (library dsv41_h5; golden/ depends on nothing else of reports/). Host-only.
//
//   H5File      an open, read-only HDF5 file (RAII)
//   Array<T>    a dataset's values in row-major order plus its shape
//
// Contract: read<T>() returns the dataset exactly as stored; T must match the stored type
// (uint8_t, uint16_t, int32_t, int64_t: an integer of that size and signedness; float: a 32-bit
// float), and the rank must match when one is asked for. Every failure (missing or unreadable
// file, missing dataset or group, wrong type, wrong rank) throws dsv41::Error naming the file
// and the dataset. HDF5's own error printing is silenced while these functions run.
//
// Example:
//   H5File f(std::string(DSV41_SOURCE_DIR) + "/golden/vectors/kernels_quant.h5");
//   Array<uint16_t> x = f.read<uint16_t>("quant/random/input/bits", 2);  // [512, 128]
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::golden {

template <typename T>
struct Array {
  std::vector<int64_t> shape;  // [rank] extents
  std::vector<T> data;         // [prod(shape)] row-major values

  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  size_t size() const { return data.size(); }
  // Element (r, c) of a rank-2 array.
  const T& at(int64_t r, int64_t c) const { return data[static_cast<size_t>(r * shape[1] + c)]; }
};

class H5File {
 public:
  // Opens path read-only; throws if it does not exist or is not an HDF5 file.
  explicit H5File(const std::string& path);
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  const std::string& path() const { return path_; }

  // True if every link of `name` ("a/b/c") exists, whatever the object is.
  bool has(const std::string& name) const;
  // Names of the members of a group, sorted.
  std::vector<std::string> children(const std::string& group) const;
  // The dataset `name`; rank >= 0 also checks the number of dimensions.
  template <typename T>
  Array<T> read(const std::string& name, int rank = -1) const;

 private:
  std::string path_;
  int64_t id_ = -1;  // hid_t
};

extern template Array<uint8_t> H5File::read<uint8_t>(const std::string&, int) const;
extern template Array<uint16_t> H5File::read<uint16_t>(const std::string&, int) const;
extern template Array<int32_t> H5File::read<int32_t>(const std::string&, int) const;
extern template Array<int64_t> H5File::read<int64_t>(const std::string&, int) const;
extern template Array<float> H5File::read<float>(const std::string&, int) const;

}  // namespace dsv41::golden
