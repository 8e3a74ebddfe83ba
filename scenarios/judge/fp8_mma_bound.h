// scenarios/judge/fp8_mma_bound.h
//
// The derived error bound of the PRODUCTION fp8 linear (cuda/linear_fp8_mma.cu, backend `cuda`,
// claim order-variant; docs/cuda.md "Production ops"): the reference's F8 linear with each 32-wide
// block dot computed on Hopper's fp8 tensor cores instead of exactly.
//
// THE TENSOR-CORE MODEL (stated by DeepSeek, measured by others, checked on the device here):
//   DeepSeek-V3 technical report §3.5.2: "After aligning 32 mantissa products by right-shifting
//   based on the maximum exponent, the Tensor Core only uses the highest 14 bits of each mantissa
//   product for addition, and truncates bits exceeding this range." (sign-fill right shift: a
//   floor, DeepGEMM issue #50); DeepGEMM issue #176 measured a 13-bit mantissa on H100.
//   A product p = a w of two E4M3 values has a significand in [1, 4) (2 integer bits), so the 14
//   kept bits of the largest-exponent product E* end at 2^(E* - 12). With E = floor(log2 max|p|)
//   we have E* <= E, so every product keeps its bits down to the quantum
//       q = 2^(E - kFp8MmaKeptBits),  kFp8MmaKeptBits = 12,
//   and loses less than q (0 when p is a multiple of q, whatever the truncation's direction).
//   The mma's fp32 result of the aligned sum s' may be normalised to the 14-bit register
//   precision: less than 2^-13 |s'| more. So for one block of products p_i (exact sum p):
//       |d - p| <= delta = L q + 2^-13 (|p| + L q),   L = #{i : p_i not a multiple of q}
//   tests/cuda/linear_production_test.cc probes the device: products 2^j next to the largest are
//   kept for every j >= E - 12, and delta holds on random, mixed-magnitude and cancelling blocks.
//   Measured on an H100 (bench/RESULTS.md, session 14): wgmma m64n8k32 e4m3 keeps 13 bits below
//   the leading bit and drops the next one for either sign (truncation toward zero), max err/delta
//   0.22 over 30,720 random blocks; mma.sync m16n8k32 e4m3 keeps 26 (every bit the probe sees).
//
// THE LINEAR: y = sum_b s_b p_b (s_b = a_s[t, b] w_s[o/32, b], powers of two), computed as
// acc = fma(d_b, s_b, acc) over the nb = in/32 blocks in order (s_b d_b exact: a power-of-two
// scaling inside fp32's normal range), then bf16:
//   |acc - y| <= A = sum_b s_b delta_b + gamma_nb(u32) sum_b s_b (|p_b| + delta_b)
//   |bf16(acc) - y| <= A + ulp_bf16(|y| + A) / 2
//
// Example:
//   double d = fp8_mma_block_error(a_values + 32 * b, w_values + 32 * b, 32);
//   double bound = fp8_mma_linear_bound(blocks, exact_y);   // blocks: {s_b, p_b, delta_b}
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41::scenarios::judge {

// Bits kept below the leading bit of the largest product (the model above).
inline constexpr int kFp8MmaKeptBits = 12;

// The quantum q of a block whose largest |product| is max_abs (0 for max_abs == 0).
double fp8_mma_quantum(double max_abs);

// delta of one block: a [n], w [n] E4M3 values (their products and sum are exact in double).
double fp8_mma_block_error(const float* a, const float* w, int n);

struct Fp8Block {
  double scale = 0;  // s_b = a_s w_s (a power of two)
  double dot = 0;    // p_b, the exact block dot
  double error = 0;  // delta_b (fp8_mma_block_error)
};
// The bound on |y_computed - y| of one output (bf16), y its exact value (double).
double fp8_mma_linear_bound(const std::vector<Fp8Block>& blocks, double exact);

}  // namespace dsv41::scenarios::judge
