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
#include "cuda/device.h"
#include "formats/minifloat.h"
#include "reference/ops/linear.h"
#include "reference/seam/ops.h"
#include "reference/ops/tensor.h"

namespace dsv41::test {

#define DSV41_SKIP_WITHOUT_DEVICE()                                 \
  do {                                                              \
    if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline const gpu::CudaOps& cuda_ops() {
  static const gpu::CudaOps ops;  // constructed only after the skip check
  return ops;
}
inline const reference::seam::Ops& ref_ops() { return reference::seam::reference_ops(); }

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

// A random weight in `dtype`: E4M3 / E2M1 code values with E8M0 scales in [2^-8, 2^0], or bf16 / fp32.
inline reference::LinearWeight random_weight(reference::DType dtype, int64_t out, int64_t in) {
  reference::LinearWeight w;
  w.name = "test.w";
  w.dtype = dtype;
  w.out = out;
  w.in = in;
  w.w.resize(static_cast<size_t>(out * in));
  std::uniform_int_distribution<int> code(0, 255), scale(119, 127);
  std::normal_distribution<float> n(0.0f, 0.05f);
  for (float& v : w.w) {
    if (dtype == reference::DType::kF8E4M3) {
      int c = code(rng());
      while ((c & 0x7F) == 0x7F) c = code(rng());  // no NaN codes in weights
      v = formats::e4m3_decode(static_cast<uint32_t>(c));
    } else if (dtype == reference::DType::kF4) {
      v = formats::e2m1_decode(static_cast<uint32_t>(code(rng()) & 0xF));
    } else if (dtype == reference::DType::kBF16) {
      v = formats::round_to_bf16(n(rng()));
    } else {
      v = n(rng());
    }
  }
  int64_t scales = 0;
  if (dtype == reference::DType::kF8E4M3) scales = ((out + 31) / 32) * ((in + 31) / 32);
  if (dtype == reference::DType::kF4) scales = out * (in / 32);
  for (int64_t i = 0; i < scales; ++i) w.scale.push_back(formats::e8m0_decode(static_cast<uint32_t>(scale(rng()))));
  return w;
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
