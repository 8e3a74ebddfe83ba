// reference/ops/tensor.h
//
// Tensor<T>: an owning, row-major, dense array with a shape and a name, the one tensor type of
// dsv41 (ops, model, hooks, captures). It is deliberately plain: no views, no broadcasting, no
// expression templates. Element access through at(...) is bounds-checked and throws dsv41::Error
// naming the tensor and the index, so a shape mistake in the reference is an error, never a
// silent read.
//
// Where the values live. A tensor's values are in host memory (std::vector<T>, what the reference
// ops compute on), or in a backend's own memory (DeviceStorage: a CUDA allocation, say), which
// only that backend's ops read. The model passes tensors between ops without looking inside, so
// a device backend runs a whole step without a host round trip (reference/seam/ops.h). Reading a
// device tensor on the host (data(), at(), row()) is a dsv41::Error naming the tensor and where
// it lives; Ops::download copies it to the host. Copies are deep in both cases (a device tensor
// clones its storage), so a copied ModelState is an independent snapshot.
//
// Precision convention of the reference: activations that the official code holds in bf16 are
// stored as Tensor<float> whose every value is exactly a bf16 value (rounded at a named point
// with formats::round_to_bf16); fp32 tensors are Tensor<float> without that promise. Each
// function's comment states which (`// x: [T, dim] bf16`).
//
// Example:
//   Tensor<float> x({tokens, dim}, "x");
//   x.at(t, i) = 1.0f;
//   float* row = x.row(t);                    // dim contiguous values
//   Tensor<float> tail = slice_rows(x, 2, 3);  // rows 2, 3, 4
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace dsv41::reference {

// "[2, 3, 4]": a shape as messages print it.
std::string shape_string(const std::vector<int64_t>& shape);

// Memory a backend owns outside the host heap (e.g. a CUDA allocation), holding one tensor's
// values in the backend's own layout. Opaque to everything but that backend's ops.
class DeviceStorage {
 public:
  virtual ~DeviceStorage() = default;
  virtual std::string where() const = 0;                     // "cuda:0": names it in errors
  virtual std::unique_ptr<DeviceStorage> clone() const = 0;  // an independent copy
};

template <typename T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape, std::string name = "tensor", T fill = T{})
      : shape_(std::move(shape)), name_(std::move(name)) {
    data_.assign(static_cast<size_t>(checked_count()), fill);
  }
  Tensor(std::vector<int64_t> shape, std::vector<T> data, std::string name)
      : shape_(std::move(shape)), data_(std::move(data)), name_(std::move(name)) {
    DSV41_CHECK(static_cast<int64_t>(data_.size()) == checked_count(), "tensor '", name_, "': ",
                data_.size(), " values for shape of ", count(shape_), " elements");
  }
  // A tensor whose values live in `storage` (a backend's memory), not on the host.
  static Tensor on_device(std::vector<int64_t> shape, std::unique_ptr<DeviceStorage> storage, std::string name) {
    DSV41_CHECK(storage != nullptr, "tensor '", name, "': null device storage");
    Tensor t;
    t.shape_ = std::move(shape);
    t.name_ = std::move(name);
    t.checked_count();
    t.device_ = std::move(storage);
    return t;
  }

  Tensor(const Tensor& o) : shape_(o.shape_), data_(o.data_), name_(o.name_), device_(clone_of(o.device_)) {}
  Tensor& operator=(const Tensor& o) {
    if (this != &o) {
      shape_ = o.shape_;
      data_ = o.data_;
      name_ = o.name_;
      device_ = clone_of(o.device_);
    }
    return *this;
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const {
    DSV41_CHECK(i >= 0 && i < rank(), "tensor '", name_, "': no dimension ", i, " (rank ", rank(), ")");
    return shape_[static_cast<size_t>(i)];
  }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return count(shape_); }
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }

  // The same values under another shape of the same element count (row-major, no copy; host or
  // device storage alike).
  Tensor reshaped(std::vector<int64_t> shape) && {
    DSV41_CHECK(count(shape) == numel(), "tensor '", name_, "': cannot view ", shape_string(shape_), " as ",
                shape_string(shape));
    shape_ = std::move(shape);
    return std::move(*this);
  }

  // Where the values are: on the host (the reference), or in a backend's DeviceStorage.
  bool on_host() const { return device_ == nullptr; }
  std::string where() const { return device_ ? device_->where() : "host"; }
  DeviceStorage* storage() { return device_.get(); }
  const DeviceStorage* storage() const { return device_.get(); }

  // Host values (a dsv41::Error for a device tensor).
  std::vector<T>& data() { return host(); }
  const std::vector<T>& data() const { return host(); }

  // Checked element access, one index per dimension.
  template <typename... I>
  T& at(I... idx) { return host()[offset({static_cast<int64_t>(idx)...})]; }
  template <typename... I>
  const T& at(I... idx) const { return host()[offset({static_cast<int64_t>(idx)...})]; }

  // Pointer to the contiguous innermost row addressed by the leading indices.
  template <typename... I>
  T* row(I... idx) { return host().data() + row_offset({static_cast<int64_t>(idx)...}); }
  template <typename... I>
  const T* row(I... idx) const { return host().data() + row_offset({static_cast<int64_t>(idx)...}); }

  static int64_t count(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }

 private:
  static std::unique_ptr<DeviceStorage> clone_of(const std::unique_ptr<DeviceStorage>& s) {
    return s ? s->clone() : nullptr;
  }
  int64_t checked_count() const {
    for (int64_t s : shape_) DSV41_CHECK(s >= 0, "tensor '", name_, "': negative dimension ", s);
    return count(shape_);
  }
  std::vector<T>& host() {
    check_host();
    return data_;
  }
  const std::vector<T>& host() const {
    check_host();
    return data_;
  }
  void check_host() const {
    DSV41_CHECK(device_ == nullptr, "tensor '", name_, "' lives in ", device_->where(),
                " memory; the host reads it only after Ops::download");
  }
  // Row-major offset of the leading idx.size() indices, each checked against its dimension.
  int64_t leading_offset(std::initializer_list<int64_t> idx) const {
    int64_t off = 0;
    int d = 0;
    for (int64_t i : idx) {
      DSV41_CHECK(i >= 0 && i < shape_[static_cast<size_t>(d)], "tensor '", name_, "': index ", i,
                  " out of range [0, ", shape_[static_cast<size_t>(d)], ") in dimension ", d);
      off = off * shape_[static_cast<size_t>(d)] + i;
      ++d;
    }
    return off;
  }
  size_t offset(std::initializer_list<int64_t> idx) const {
    DSV41_CHECK(static_cast<int>(idx.size()) == rank(), "tensor '", name_, "': ", idx.size(),
                " indices for rank ", rank());
    return static_cast<size_t>(leading_offset(idx));
  }
  size_t row_offset(std::initializer_list<int64_t> idx) const {
    DSV41_CHECK(static_cast<int>(idx.size()) == rank() - 1, "tensor '", name_, "': row() takes ",
                rank() - 1, " indices, got ", idx.size());
    return static_cast<size_t>(leading_offset(idx) * (rank() ? shape_.back() : 1));
  }

  std::vector<int64_t> shape_;
  std::vector<T> data_;
  std::string name_ = "tensor";
  std::unique_ptr<DeviceStorage> device_;  // set: the values live there and data_ is empty
};

// Rows [first, first + count) of a host tensor along its first dimension (values copied).
template <typename T>
Tensor<T> slice_rows(const Tensor<T>& x, int64_t first, int64_t count) {
  DSV41_CHECK(x.rank() >= 1 && first >= 0 && count >= 0 && first + count <= x.dim(0), "rows [", first, ", ",
              first + count, ") outside ", x.rank() >= 1 ? x.dim(0) : 0, " rows of '", x.name(), "'");
  std::vector<int64_t> shape = x.shape();
  const int64_t row = x.dim(0) == 0 ? 0 : x.numel() / x.dim(0);
  shape[0] = count;
  std::vector<T> data(x.data().begin() + first * row, x.data().begin() + (first + count) * row);
  return Tensor<T>(shape, std::move(data), x.name());
}

}  // namespace dsv41::reference
