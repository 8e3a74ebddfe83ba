// tests/cuda/cuda_test_util.h
//
// Shared by the tests/cuda/<component>_test.cc files: the skip without a device, one CudaOps per
// test binary, random bf16 tensors, and bit-for-bit comparison of a CudaOps result (downloaded)
// with the reference op's. Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ops.h"
#include "cuda/ops.h"
#include "formats/minifloat.h"
#include "reference/ops.h"
#include "reference/tensor.h"

namespace dsv41::test {

#define DSV41_SKIP_WITHOUT_DEVICE()                                 \
  do {                                                              \
    if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline const gpu::CudaOps& cuda_ops() {
  static const gpu::CudaOps ops;  // constructed only after the skip check
  return ops;
}
inline const reference::Ops& ref_ops() { return reference::reference_ops(); }

inline std::mt19937_64& rng() {
  static std::mt19937_64 g = [] {
    const char* s = std::getenv("DSV41_SEED");
    const uint64_t seed = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    std::printf("DSV41_SEED=%llu\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return g;
}

// bf16 values, normal with standard deviation `scale`.
inline reference::Tensor<float> random_bf16(std::vector<int64_t> shape, float scale = 1.0f,
                                            std::string name = "x") {
  reference::Tensor<float> t(std::move(shape), std::move(name));
  std::normal_distribution<float> d(0.0f, scale);
  for (float& v : t.data()) v = formats::round_to_bf16(d(rng()));
  return t;
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Same shape and the same bits everywhere (NaNs compare by bits too).
template <typename T>
::testing::AssertionResult same_bits(const reference::Tensor<T>& want, reference::Tensor<T> got_any) {
  const reference::Tensor<T> got = cuda_ops().download(std::move(got_any));
  if (want.shape() != got.shape()) {
    return ::testing::AssertionFailure() << "shape " << reference::shape_string(got.shape()) << ", want "
                                         << reference::shape_string(want.shape());
  }
  for (int64_t i = 0; i < want.numel(); ++i) {
    const T a = want.data()[static_cast<size_t>(i)], b = got.data()[static_cast<size_t>(i)];
    if (std::memcmp(&a, &b, sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "first difference at flat index " << i << " of " << want.numel()
                                           << ": got " << +b << ", want " << +a;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace dsv41::test
