// cuda/device_tensor.h
//
// CudaStorage: the DeviceStorage (reference/ops/tensor.h) of the CUDA path, one cudaMalloc'd buffer
// per tensor (clone = a device-to-device copy), and helpers that make device tensors and reach
// their pointers. Host header (no CUDA types); used by cuda/cuda_ops.cc and cuda_fallback.cc.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/device.h"
#include "base/error.h"
#include "reference/ops/tensor.h"

namespace dsv41::gpu {

class CudaStorage final : public reference::DeviceStorage {
 public:
  explicit CudaStorage(std::size_t bytes) : bytes_(bytes), p_(device_alloc(bytes)) {}
  ~CudaStorage() override { device_free(p_); }
  CudaStorage(const CudaStorage&) = delete;
  CudaStorage& operator=(const CudaStorage&) = delete;
  std::string where() const override { return "cuda:0"; }
  std::unique_ptr<reference::DeviceStorage> clone() const override {
    auto c = std::make_unique<CudaStorage>(bytes_);
    copy_on_device(c->p_, p_, bytes_);
    return c;
  }
  void* data() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  void* p_;
};

// An uninitialised device tensor of `shape`.
template <typename T>
reference::Tensor<T> device_tensor(std::vector<int64_t> shape, std::string name) {
  const std::size_t bytes = static_cast<std::size_t>(reference::Tensor<T>::count(shape)) * sizeof(T);
  return reference::Tensor<T>::on_device(std::move(shape), std::make_unique<CudaStorage>(bytes), std::move(name));
}

// The device pointer of a CUDA tensor (a dsv41::Error for a host tensor or another backend's).
template <typename T>
T* dev(reference::Tensor<T>& t) {
  auto* s = dynamic_cast<CudaStorage*>(t.storage());
  DSV41_CHECK(s != nullptr, "tensor '", t.name(), "' lives in ", t.where(), " memory, not CUDA memory");
  return static_cast<T*>(s->data());
}
template <typename T>
const T* dev(const reference::Tensor<T>& t) {
  return dev(const_cast<reference::Tensor<T>&>(t));
}

// A tensor's values on the device: the tensor's own storage, or an uploaded temporary copy of a
// host tensor (ops accept host inputs).
template <typename T>
class DevIn {
 public:
  explicit DevIn(const reference::Tensor<T>& t) {
    if (t.on_host()) {
      tmp_ = device_tensor<T>(t.shape(), t.name());
      if (t.numel() > 0) copy_to_device(dev(tmp_), t.data().data(), static_cast<std::size_t>(t.numel()) * sizeof(T));
      p_ = dev(tmp_);
    } else {
      p_ = dev(t);
    }
  }
  const T* get() const { return p_; }

 private:
  reference::Tensor<T> tmp_;
  const T* p_ = nullptr;
};

// A host vector copied to a fresh device buffer (index lists, token ids).
template <typename T>
std::unique_ptr<DeviceBuffer<T>> to_device(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBuffer<T>>(v.size());
  if (!v.empty()) b->upload(v);
  return b;
}

}  // namespace dsv41::gpu
