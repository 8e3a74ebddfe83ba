// reference/ops/rmsnorm.cc
//
// RMSNorm and torch's CPU fp32 sum order (rmsnorm.h states the semantics and the evidence).
#include "reference/ops/rmsnorm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference {
namespace {

constexpr int kLevels = 4;  // multi_row_sum's num_levels

// ceil(log2(v)), 0 for v <= 1 (c10::llvm::CeilLog2).
int64_t ceil_log2(int64_t v) {
  int64_t r = 0;
  while ((int64_t{1} << r) < v) ++r;
  return r;
}

// A group of `W` fp32 lanes added lane-wise: one Vectorized<float> (W = 8) or one scalar (W = 1).
template <int64_t W>
using Lanes = std::array<float, W>;

template <int64_t W>
void add_into(Lanes<W>& acc, const Lanes<W>& v) {
  for (int64_t l = 0; l < W; ++l) acc[l] += v[l];
}

// The `index`-th group of W consecutive values of x.
template <int64_t W>
Lanes<W> load(const float* x, int64_t index) {
  Lanes<W> v;
  for (int64_t l = 0; l < W; ++l) v[l] = x[index * W + l];
  return v;
}

// torch row_sum over `count` groups of W lanes: kTorchSumChains chains through multi_row_sum's
// cascade, leftovers into chain 0, then chain 0 += chains 1..3. Returns the W lanes of chain 0.
template <int64_t W>
Lanes<W> row_sum(const float* x, int64_t count) {
  constexpr int64_t C = kTorchSumChains;
  const int64_t rows = count / C;  // multi_row_sum "size": rows of C groups
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(rows) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;

  std::array<std::array<Lanes<W>, C>, kLevels> acc{};  // all +0
  int64_t i = 0;
  while (i + level_step <= rows) {
    for (int64_t j = 0; j < level_step; ++j, ++i) {
      for (int64_t k = 0; k < C; ++k) add_into<W>(acc[0][k], load<W>(x, i * C + k));
    }
    for (int j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < C; ++k) {
        add_into<W>(acc[j][k], acc[j - 1][k]);
        acc[j - 1][k] = Lanes<W>{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < rows; ++i) {
    for (int64_t k = 0; k < C; ++k) add_into<W>(acc[0][k], load<W>(x, i * C + k));
  }
  for (int j = 1; j < kLevels; ++j) {
    for (int64_t k = 0; k < C; ++k) add_into<W>(acc[0][k], acc[j][k]);
  }
  for (int64_t g = rows * C; g < count; ++g) add_into<W>(acc[0][0], load<W>(x, g));
  for (int64_t k = 1; k < C; ++k) add_into<W>(acc[0][0], acc[0][k]);
  return acc[0][0];
}

}  // namespace

float torch_sum_f32(const float* x, int64_t n) {
  DSV41_CHECK(n >= 0 && n < kTorchSerialSumLimit, "torch_sum_f32: n=", n,
              " outside [0, 32768): longer rows are split over threads by torch, an order the "
              "reference does not model");
  if (n < kTorchSumLanes) return row_sum<1>(x, n)[0];  // scalar_inner_sum
  // vectorized_inner_sum: vectors, then the scalar tail, then the lanes left to right.
  const int64_t vectors = n / kTorchSumLanes;
  const Lanes<kTorchSumLanes> lanes = row_sum<kTorchSumLanes>(x, vectors);
  float sum = 0.0f;
  for (int64_t i = vectors * kTorchSumLanes; i < n; ++i) sum += x[i];
  for (int64_t l = 0; l < kTorchSumLanes; ++l) sum += lanes[l];
  return sum;
}

float rms_rsqrt_f32(const float* x, int64_t n, double eps) {
  DSV41_CHECK(n > 0, "rms_rsqrt_f32: empty row");
  std::vector<float> sq(static_cast<size_t>(n));  // x.square(): fp32
  for (int64_t i = 0; i < n; ++i) sq[i] = x[i] * x[i];
  const float var = torch_sum_f32(sq.data(), n) / static_cast<float>(n);  // mean = sum, then div_
  return 1.0f / std::sqrt(var + static_cast<float>(eps));                 // torch CPU rsqrt
}

void rms_norm_row(const float* x, const float* weight, int64_t n, double eps, float* y) {
  const float r = rms_rsqrt_f32(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(weight[i] * (x[i] * r));
}

Tensor<float> rms_norm(const Tensor<float>& x, const std::vector<float>& weight, double eps) {
  DSV41_CHECK(x.rank() >= 1, "rms_norm: input '", x.name(), "' has rank 0");
  const int64_t n = x.dim(x.rank() - 1);
  DSV41_CHECK(n > 0 && static_cast<int64_t>(weight.size()) == n, "rms_norm: input '", x.name(),
              "' has last dimension ", n, " but the weight holds ", weight.size(), " values");
  const int64_t rows = x.numel() / n;
  Tensor<float> y(x.shape(), x.name() + ".rms_norm");
  parallel_for(rows, [&](int64_t r) {
    rms_norm_row(x.data().data() + r * n, weight.data(), n, eps, y.data().data() + r * n);
  });
  return y;
}

}  // namespace dsv41::reference
