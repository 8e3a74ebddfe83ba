// reference/tensor.h
//
// Tensor<T>: an owning, row-major, dense array with a shape, used by every reference component.
// It is deliberately plain: no views, no broadcasting, no expression templates. Element access
// through at(...) is bounds-checked and throws dsv41::Error naming the tensor and the index, so
// a shape mistake in the reference is an error, never a silent read.
//
// Precision convention of the reference: activations that the official code holds in bf16 are
// stored as Tensor<float> whose every value is exactly a bf16 value (rounded at a named point
// with formats::round_to_bf16); fp32 tensors are Tensor<float> without that promise. Each
// function's comment states which (`// x: [T, dim] bf16`).
//
// Example:
//   Tensor<float> x({tokens, dim}, "x");
//   x.at(t, i) = 1.0f;
//   float* row = x.row(t);  // dim contiguous values
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "formats/error.h"

namespace dsv41::reference {

template <typename T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape, std::string name = "tensor", T fill = T{})
      : shape_(std::move(shape)), name_(std::move(name)) {
    int64_t n = 1;
    for (int64_t s : shape_) {
      DSV41_CHECK(s >= 0, "tensor '", name_, "': negative dimension ", s);
      n *= s;
    }
    data_.assign(static_cast<size_t>(n), fill);
  }
  Tensor(std::vector<int64_t> shape, std::vector<T> data, std::string name)
      : shape_(std::move(shape)), data_(std::move(data)), name_(std::move(name)) {
    DSV41_CHECK(static_cast<int64_t>(data_.size()) == count(shape_), "tensor '", name_, "': ",
                data_.size(), " values for shape of ", count(shape_), " elements");
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const {
    DSV41_CHECK(i >= 0 && i < rank(), "tensor '", name_, "': no dimension ", i, " (rank ", rank(), ")");
    return shape_[static_cast<size_t>(i)];
  }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }

  std::vector<T>& data() { return data_; }
  const std::vector<T>& data() const { return data_; }

  // Checked element access, one index per dimension.
  template <typename... I>
  T& at(I... idx) { return data_[offset({static_cast<int64_t>(idx)...})]; }
  template <typename... I>
  const T& at(I... idx) const { return data_[offset({static_cast<int64_t>(idx)...})]; }

  // Pointer to the contiguous innermost row addressed by the leading indices.
  template <typename... I>
  T* row(I... idx) { return data_.data() + row_offset({static_cast<int64_t>(idx)...}); }
  template <typename... I>
  const T* row(I... idx) const { return data_.data() + row_offset({static_cast<int64_t>(idx)...}); }

  static int64_t count(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }

 private:
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
};

}  // namespace dsv41::reference
