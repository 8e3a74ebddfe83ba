// reference/numerics.h
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
#include <functional>

#include "formats/minifloat.h"

namespace dsv41::reference {

using formats::round_to_bf16;

// sum_i a[i]*b[i] accumulated in double in index order, rounded once to fp32.
// For fp8 x fp8 and fp4 x fp8 operands of one 32-wide block this is the exact value rounded once.
float dot_f64_f32(const float* a, const float* b, int64_t n);

// Same, with stride for b (b[i * stride]).
float dot_f64_f32_strided(const float* a, const float* b, int64_t stride, int64_t n);

// The number of worker threads the reference uses: env DSV41_THREADS if set (>= 1), else
// std::thread::hardware_concurrency(). Results never depend on it.
int reference_threads();
void set_reference_threads(int n);  // 0 restores the default

// Calls fn(i) for i in [0, n), split in contiguous chunks over reference_threads() threads.
// fn must write only outputs owned by i. Exceptions are re-thrown on the caller's thread.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace dsv41::reference
