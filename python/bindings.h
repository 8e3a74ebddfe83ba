// python/bindings.h
//
// Shared by the binding files of the `dsv41` Python module (python/*.cc, docs/python.md): numpy
// arrays to and from the reference's tensors, and the registration functions of each part.
//
// Conversions (one rule everywhere, docs/python.md "Arrays"):
//   floats in   float32 (bf16 values held exactly as float32, the reference's convention) or
//               uint16 (raw bf16 bits, decoded exactly); any other dtype is refused with a
//               dsv41.Error naming the input, never cast (a float64 would be rounded silently)
//   ints in     int32 / int64 / uint8 as the op states (an integer array of another width is
//               refused likewise)
//   out         numpy arrays that own the reference's buffer (moved, not copied)
// The reference's Tensor owns its values (reference/ops/tensor.h: no views), so inputs are copied once.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/tensor.h"

namespace dsv41::python {

namespace py = pybind11;

inline std::vector<int64_t> shape_of(const py::array& a) {
  return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
}

// A Python int parameter narrowed to T (issue 35: never truncated): read as a 64-bit integer (a
// larger one is refused), then range-checked against [lo, hi] (default: T's range), with the
// parameter's name in the message: "parameter 'k': 4294967304 is out of range (-2147483648 ..
// 2147483647)". A bool or a float is refused too (k=True would be 1 silently).
template <typename T = int>
T int_param(const py::handle& v, const std::string& name, int64_t lo = std::numeric_limits<T>::min(),
            int64_t hi = static_cast<int64_t>(std::numeric_limits<T>::max())) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
    DSV41_FAIL("parameter '", name, "': expected an int, got ", py::str(v.get_type()).cast<std::string>());
  }
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0) {
    DSV41_FAIL("parameter '", name, "': ", py::str(v).cast<std::string>(), " does not fit a 64-bit integer");
  }
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (x < lo || x > hi) {
    DSV41_FAIL("parameter '", name, "': ", x, " is out of range (", lo, " .. ", hi, ")");
  }
  return static_cast<T>(x);
}

inline std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// Any array-like to a C-contiguous array of its own dtype (no cast).
inline py::array as_array(const py::handle& h) {
  return py::array::ensure(h, py::array::c_style);
}

// float32 or uint16 (bf16 bits) -> Tensor<float> named `name`.
inline reference::Tensor<float> to_f32(const py::handle& h, const std::string& name) {
  py::array a = as_array(h);
  if (!a) DSV41_FAIL("input '", name, "': not an array");
  const std::vector<int64_t> shape = shape_of(a);
  const int64_t n = reference::Tensor<float>::count(shape);
  std::vector<float> v(static_cast<size_t>(n));
  if (a.dtype().is(py::dtype::of<float>())) {
    if (n) std::memcpy(v.data(), a.data(), static_cast<size_t>(n) * sizeof(float));
  } else if (a.dtype().is(py::dtype::of<uint16_t>())) {
    const auto* p = static_cast<const uint16_t*>(a.data());
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = formats::bf16_decode(p[i]);
  } else {
    DSV41_FAIL("input '", name, "': dtype ", dtype_str(a),
               "; expected float32 (bf16 values held exactly as float32) or uint16 (bf16 bits)");
  }
  return reference::Tensor<float>(shape, std::move(v), name);
}

template <typename T>
inline reference::Tensor<T> to_int(const py::handle& h, const std::string& name) {
  py::array a = as_array(h);
  if (!a) DSV41_FAIL("input '", name, "': not an array");
  if (!a.dtype().is(py::dtype::of<T>())) {
    DSV41_FAIL("input '", name, "': dtype ", dtype_str(a), "; expected ", py::str(py::dtype::of<T>()).cast<std::string>());
  }
  const std::vector<int64_t> shape = shape_of(a);
  const int64_t n = reference::Tensor<T>::count(shape);
  std::vector<T> v(static_cast<size_t>(n));
  if (n) std::memcpy(v.data(), a.data(), static_cast<size_t>(n) * sizeof(T));
  return reference::Tensor<T>(shape, std::move(v), name);
}

// A vector moved into a numpy array of `shape` (no copy: the array owns the vector).
template <typename T>
inline py::array to_numpy(std::vector<T>&& v, const std::vector<int64_t>& shape) {
  auto* owner = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owner, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  std::vector<py::ssize_t> s(shape.begin(), shape.end());
  return py::array_t<T>(s, owner->data(), free_when_done);
}

template <typename T>
inline py::array to_numpy(reference::Tensor<T>&& t) {
  const std::vector<int64_t> shape = t.shape();
  return to_numpy(std::move(t.data()), shape);
}
template <typename T>
inline py::array to_numpy(const reference::Tensor<T>& t) {
  std::vector<T> copy = t.data();
  return to_numpy(std::move(copy), t.shape());
}

// The registration of each part of the module (one file each).
void register_formats(py::module_& m);   // python/bind_formats.cc
void register_model(py::module_& m);     // python/bind_model.cc
void register_ops(py::module_& m);       // python/bind_ops.cc
void register_conform(py::module_& m);   // python/bind_conform.cc
void register_check(py::module_& m);     // python/bind_check.cc
void register_port_writer(py::module_& m);  // python/bind_port_writer.cc

}  // namespace dsv41::python
