#include "scenarios/judge/fp8_mma_bound.h"

#include <algorithm>
#include <cmath>

namespace dsv41::scenarios::judge {
namespace {

constexpr double kU32 = 0x1p-24;
constexpr double kRegister = 0x1p-13;  // the result's 14-bit register precision

double gamma_u32(int64_t n) { return static_cast<double>(n) * kU32 / (1.0 - static_cast<double>(n) * kU32); }

// Half a bf16 ulp of the binade holding v >= 0 (the subnormal spacing below the normal range).
double half_ulp_bf16(double v) {
  if (v < 0x1p-126) return 0x1p-133 / 2;
  return std::ldexp(1.0, std::ilogb(v) - 7) / 2;
}

}  // namespace

double fp8_mma_quantum(double max_abs) {
  if (max_abs == 0) return 0;
  return std::ldexp(1.0, std::ilogb(max_abs) - kFp8MmaKeptBits);
}

double fp8_mma_block_error(const float* a, const float* w, int n) {
  double max_abs = 0, sum = 0;
  for (int i = 0; i < n; ++i) {
    const double p = static_cast<double>(a[i]) * static_cast<double>(w[i]);  // exact (8 significant bits)
    max_abs = std::max(max_abs, std::fabs(p));
    sum += p;  // exact: multiples of 2^-18 below 2^23
  }
  const double q = fp8_mma_quantum(max_abs);
  if (q == 0) return 0;
  int64_t lossy = 0;
  for (int i = 0; i < n; ++i) {
    const double p = static_cast<double>(a[i]) * static_cast<double>(w[i]);
    if (std::fmod(p, q) != 0) ++lossy;
  }
  const double trunc = static_cast<double>(lossy) * q;
  return trunc + kRegister * (std::fabs(sum) + trunc);
}

double fp8_mma_linear_bound(const std::vector<Fp8Block>& blocks, double exact) {
  double err = 0, mag = 0;
  for (const Fp8Block& b : blocks) {
    err += b.scale * b.error;
    mag += b.scale * (std::fabs(b.dot) + b.error);
  }
  const double acc = err + gamma_u32(static_cast<int64_t>(blocks.size())) * mag;
  return acc + half_ulp_bf16(std::fabs(exact) + acc);
}

}  // namespace dsv41::scenarios::judge
