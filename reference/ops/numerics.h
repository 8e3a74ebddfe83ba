// reference/ops/numerics.h
//
// The numerics policy of the reference in code (docs/numerics.md explains it):
//   - Reductions have one fixed order, written here, and never depend on the thread count:
//     threads (parallel_for) only ever split independent outputs, never one sum.
//   - Dot products of quantized operands (fp8 x fp8, fp4 x fp8 within one 32-wide K block) are
//     EXACT: every product and every partial sum fits a double, so the block result is the true
//     value rounded once to fp32 (dot_f64_f32 on such operands). It is order-free, hence what any correct
//     kernel should approach.
//   - Other dot products (bf16 and fp32 weights) accumulate in double in index order and round
//     once to fp32 (dot_f64_f32); the error bound is documented in docs/numerics.md and checked
//     against Boost.Multiprecision in tests.
//   - bf16 rounding happens at named points with formats::round_to_bf16.
//   - Transcendentals: std::exp, std::log, std::sqrt in float, from the one libm the build links.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>

#include "formats/minifloat.h"

// Runtime-dispatched clones (GCC on x86-64, an ifunc picks one when the program loads) for
// kernels whose result does not depend on the instructions: FMA chains (std::fma is exact by
// definition) and exact sums (dot_exact_f32). Elsewhere one plain version: under sanitizers, and
// with Clang, whose function multiversioning differs from GCC's (Clang 14 sent a call from another
// translation unit of a function declared with target_clones to a wrong target: the sanitizer job's
// IndexerScores.VectorLanesAreTheFormulaPerKey found scores of 0). Clang does not define
// __SANITIZE_ADDRESS__, which is one more reason to leave it out. A cloned function is declared
// without the attribute in headers (callers elsewhere call the ifunc by its plain name).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define DSV41_CPU_CLONES 1
#define DSV41_FMA_CLONES __attribute__((target_clones("fma", "default")))
#define DSV41_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DSV41_CPU_CLONES 0
#define DSV41_FMA_CLONES
#define DSV41_SIMD_CLONES
#endif

namespace dsv41::reference {

// SplitMix64 (Steele, Lea, Flood 2014): output i (0, 1, ...) of the generator seeded with s, the
// finalizer of s + (i + 1) * 0x9E3779B97F4A7C15. The seed derivations of the CLI and the benches
// are built on it (a fixed, portable function of integers).
inline uint64_t splitmix64(uint64_t s, uint64_t i = 0) {
  uint64_t z = s + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

using formats::round_to_bf16;

// sum_i a[i]*b[i] accumulated in double in index order, rounded once to fp32.
// For fp8 x fp8 and fp4 x fp8 operands of one 32-wide block this is the exact value rounded once.
inline float dot_f64_f32(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return static_cast<float>(acc);
}

// dot_f64_f32 of one `a` against four rows b[0..3] at once: out[k] = dot_f64_f32(a, b[k], n),
// each sum in index order by itself (the four chains only run side by side: the same bits).
inline void dot_f64_f32_x4(const float* a, const float* const* b, int64_t n, float* out) {
  double acc0 = 0.0, acc1 = 0.0, acc2 = 0.0, acc3 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    acc0 += x * static_cast<double>(b[0][i]);
    acc1 += x * static_cast<double>(b[1][i]);
    acc2 += x * static_cast<double>(b[2][i]);
    acc3 += x * static_cast<double>(b[3][i]);
  }
  out[0] = static_cast<float>(acc0);
  out[1] = static_cast<float>(acc1);
  out[2] = static_cast<float>(acc2);
  out[3] = static_cast<float>(acc3);
}

// The exact sum_i a[i]*b[i] rounded once to fp32, FOR OPERANDS WHOSE PRODUCTS AND PARTIAL SUMS
// ARE ALL EXACT IN DOUBLE (the caller's promise): E4M3 x E4M3 and E2M1 x E4M3 values of one 32-wide
// block (every E4M3 value is a multiple of 2^-9, so every product a multiple of 2^-18, and 32 of
// them below 2^23: at most 41 significant bits). Such a sum does not depend on the order, so it is
// taken in four chains (what a vector unit does) and equals dot_f64_f32 bit for bit
// (tests/reference/ops/numerics_test.cc checks it on every code pair).
inline float dot_exact_f32(const float* a, const float* b, int64_t n) {
  // Vectors of 4: the products in fp32 (exact too: at most 4 + 4 significant bits, and above 2^-18),
  // widened to double and summed in two chains.
  typedef float v4f __attribute__((vector_size(16)));
  typedef double v4d __attribute__((vector_size(32)));
  v4d acc0 = {0.0, 0.0, 0.0, 0.0}, acc1 = acc0;
  const int64_t whole = n / 8 * 8;  // the tail (n % 8 terms) is added after the vectors
  for (int64_t i = 0; i < whole; i += 8) {
    v4f x0, y0, x1, y1;
    std::memcpy(&x0, a + i, sizeof x0);
    std::memcpy(&y0, b + i, sizeof y0);
    std::memcpy(&x1, a + i + 4, sizeof x1);
    std::memcpy(&y1, b + i + 4, sizeof y1);
    acc0 += __builtin_convertvector(x0 * y0, v4d);
    acc1 += __builtin_convertvector(x1 * y1, v4d);
  }
  const v4d acc = acc0 + acc1;
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int64_t k = 0; k < n % 8; ++k) sum += static_cast<double>(a[whole + k]) * static_cast<double>(b[whole + k]);
  return static_cast<float>(sum);
}

// sum_i a[i] * b[i * stride] as one fp32 fused multiply-add chain in index order, from +0:
// acc = fma(a[i], b[i * stride], acc). The order of torch's multi-row CPU fp32 GEMM (measured,
// docs/numerics.md). std::fma is exact by definition; where the CPU has FMA this runs as the
// hardware instruction (a runtime-dispatched clone), elsewhere as libm's fmaf: the same bits.
float fma_dot_f32(const float* a, const float* b, int64_t stride, int64_t n);

// fma_dot_f32 of `a` against four `b` rows at once (b[k][i * stride]); each chain in index order.
void fma_dot_f32_x4(const float* a, const float* const* b, int64_t stride, int64_t n, float* out);

// The number of worker threads the reference uses: env DSV41_THREADS if set (>= 1), else
// std::thread::hardware_concurrency(). Results never depend on it.
int reference_threads();
void set_reference_threads(int n);  // 0 restores the default

// Calls fn(i) for i in [0, n), split in contiguous chunks over reference_threads() threads of a
// persistent pool (started on first use; a call from inside a parallel_for runs serially on its
// thread). fn must write only outputs owned by i. Exceptions are re-thrown on the caller's thread.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace dsv41::reference
