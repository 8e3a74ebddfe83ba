// scenarios/exact/exact_internal.h
//
// Shared by the op cases of scenarios/exact/exact_ops_*.cc: the seeded draws of inputs and the Eigen
// matrices over the Exact scalar (boost/multiprecision/eigen.hpp gives Eigen its NumTraits).
#pragma once

#include <boost/multiprecision/eigen.hpp>
#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/minifloat.h"
#include "reference/ops/linear.h"
#include "reference/ops/numerics.h"
#include "reference/ops/tensor.h"
#include "scenarios/exact/exact_eval.h"

namespace dsv41::scenarios::exact {

using ExactMatrix = Eigen::Matrix<Exact, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A seeded stream of draws (reference::splitmix64 of (seed, counter)); one stream per case,
// derived from the run's seed and the case's name, so adding a case does not move the others.
class Draws {
 public:
  Draws(uint64_t seed, const std::string& stream) : seed_(seed) {
    for (char ch : stream) seed_ = reference::splitmix64(seed_ ^ static_cast<uint8_t>(ch));
  }
  uint64_t bits() { return reference::splitmix64(seed_, i_++); }
  double uniform() { return static_cast<double>(bits() >> 11) * 0x1.0p-53; }  // [0, 1)
  double symmetric(double a) { return (2.0 * uniform() - 1.0) * a; }          // [-a, a)
  // A normal draw (Box-Muller), then rounded to bf16 / fp32.
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  float bf16(double scale) { return formats::round_to_bf16(static_cast<float>(normal() * scale)); }
  float f32(double scale) { return static_cast<float>(normal() * scale); }
  // A finite E4M3 value (any code but NaN), an E2M1 value, an E8M0 power of two 2^[lo, hi].
  float e4m3() {
    uint32_t c = 0;
    do c = static_cast<uint32_t>(bits() & 0xFF); while ((c & 0x7F) == 0x7F);
    return formats::e4m3_decode(c);
  }
  float e2m1() { return formats::e2m1_decode(static_cast<uint32_t>(bits() & 0xF)); }
  float pow2(int lo, int hi) {
    return std::ldexp(1.0f, lo + static_cast<int>(bits() % static_cast<uint64_t>(hi - lo + 1)));
  }

 private:
  uint64_t seed_;
  uint64_t i_ = 0;
};

// A bf16 tensor of normal draws times `scale`.
inline reference::Tensor<float> bf16_tensor(Draws& d, std::vector<int64_t> shape, double scale, std::string name) {
  reference::Tensor<float> t(std::move(shape), std::move(name));
  for (float& v : t.data()) v = d.bf16(scale);
  return t;
}

// Rows x cols of float values as an exact matrix.
inline ExactMatrix exact_matrix(const float* v, int64_t rows, int64_t cols) {
  ExactMatrix m(rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) m(r, c) = exact_of(v[r * cols + c]);
  }
  return m;
}

inline ExactMatrix abs_of(const ExactMatrix& m) { return m.unaryExpr([](const Exact& x) { return Exact(mp::abs(x)); }); }

// scenarios/exact/exact_ops_linear.cc: one row of an F8/F4 linear, exactly: act_quant(x) (the spec's
// quantizer), then y[o] = sum_b a_s[b] w_s[o, b] p_b (p_b the exact 32-wide block dot), and
// mag[o] = sum_b |a_s w_s p_b|. x: [w.in] bf16 -> y, mag: [w.out]. tc (optional): [w.out] the
// fp8 tensor-core term sum_b a_s w_s delta_b of an F8 weight (scenarios/judge/fp8_mma_bound.h;
// zeros for other dtypes).
void exact_quantized_row(const float* x, const reference::LinearWeight& w, std::vector<Exact>& y,
                         std::vector<Exact>& mag, std::vector<double>* tc = nullptr);
// A random F8/F4/BF16/F32 weight [out, in] (E4M3/E2M1 codes, E8M0 block scales).
reference::LinearWeight random_weight(Draws& d, reference::DType dtype, int64_t out, int64_t in, const std::string& name);

// scenarios/exact/exact_ops_sparse_attn.cc. q: [T, H, D] bf16, kv: [N, D] bf16, sink: [H] fp32,
// idxs: [T, K] int32 (-1 = none).
OpCase sparse_attn_case(const std::string& inputs, const reference::Tensor<float>& q, const reference::Tensor<float>& kv,
                        const reference::Tensor<float>& sink, const reference::Tensor<int32_t>& idxs, float scale);

inline double to_double(const Exact& x) { return x.convert_to<double>(); }

}  // namespace dsv41::scenarios::exact
