// scenarios/judge/sparse_attn_mma_bound.h
//
// The derived error bound of the PRODUCTION sparse attention (cuda/attention_wgmma.cu and its
// mma.sync variant cuda/attention_mma.cu, backend `cuda`,
// claim order-variant; docs/cuda.md "Production ops") and, for comparison, of the reference's own
// arithmetic (reference/ops/attention.cc): per (query, head) row, the exact value of every output
// channel and a bound on |computed - exact|.
//
// THE SEMANTICS (reference/ops/attention.h; the same as scenarios/exact/exact_ops_sparse_attn.cc):
//   s_j = q . kv_j * scale (exact), m_b the running max after 64-block b (from -1e30), M the last,
//   out = sum_j bf16(exp(s_j - m_b(j))) exp(m_b(j) - M) v_j / (sum_j exp(s_j - M) + exp(sink - M)),
//   the bf16 rounding of each probability the spec's own; index -1 contributes nothing.
//
// THE TENSOR-CORE STEP MODEL (mma.sync m16n8k16 bf16, fp32 accumulate): one step computes
// d = c + sum_{i<16} a_i b_i from exact products (bf16 x bf16 fits fp32), aligned to the largest
// exponent E among c and the products, bits below 2^(E - 23) truncated per term (at most 17 terms
// lose less than 2^(E - 23) each), the result normalised with at most two fp32 roundings (relative
// 2^-23 each). So |d - (c + sum a_i b_i)| <= 17 2^-23 max + 2^-22 (|c| + sum |a_i b_i|) <=
//   delta = kBf16MmaStepRel (|c| + sum_i |a_i b_i|),   kBf16MmaStepRel = 2^-18 (= 32 2^-23).
// The published measurements (Fasi et al. 2021 on V100/T4/A100: truncation after alignment, no
// guard bits on some; sub-blocks of 4 or 8 terms each normalised) fit: 4 sub-blocks of 5 terms
// give at most 24 2^-23. tests/cuda/sparse_attn_production_test.cc probes the device: the bits
// kept next to the largest term, and delta on random, mixed-magnitude and cancelling steps.
//
// THE KERNEL'S ORDER and its roundings (u = 2^-24):
//   scores: one accumulator over D/16 steps of 16 channels in order (cuda/attention_wgmma.cu), or
//     per channel half one over D/32 steps, then half0 + half1 (one add; cuda/attention_mma.cu):
//     the bound takes the larger of the two; then * c2 with c2 = fl(scale log2 e) (base-2
//     exponents: the natural-unit score carries relative (1+u)^2);
//   softmax: exp2f (CUDA, 2 ulp: relative 4u) of fl(s2 - m2); the rescale r = exp2f(fl(m - m'));
//     probabilities bf16; l: fp32 sums of <= 8 terms, one fma per later block, 4 final adds;
//     sink: exp2f(fl(fl(sink * log2e_f) - m)) (3 roundings on the argument);
//   numerator: O = fl(O * r) per block (folded into the rescale's rho), then per block 4 steps of 16
//     indices accumulating into O (the step model, c = the running O);
//   out = bf16(fl(O * fl(1 / l))).
// THE SPLIT (slice_blocks > 0, kMma only: cuda/attention_wgmma.cu's flash-decoding variant): the
//   index list in slices of slice_blocks 64-blocks, each slice the order above from its own running
//   max (from -1e30), l and O = 0, giving (m_s, l_s, O_s); then M = max m_s, f_s = exp2f(fl(m_s - M)),
//   l = sum_s fl(l_s f_s) + the sink's term, O = sum_s fl(O_s f_s) (slice order), out as above.
//   Bounded as the unsplit order with each block's rescale chain ending at its slice's last block
//   and then one more factor f_s (argument, exp2f, multiply: in rho_b), the slice's accumulator its
//   own partial sum in the step model, 2 S more roundings on l and gamma_S of the partials' sum of
//   magnitudes for the combine's adds. slice_blocks 0 or >= the row's blocks: the unsplit bound.
// THE REFERENCE: the fp32 FMA chain score gamma_D(u) S_j; glibc expf (1 ulp: 2u); the numerator a
// sum of K products with K + 2B roundings (gamma_{K+2B}(u)); l with a double sum per block;
// out = bf16(fl(acc / l)): the bound of scenarios/exact/exact_ops_sparse_attn.cc.
// Both: the derivation of exact_ops_sparse_attn.cc (an interval for each probability through the
// bf16 rounding, the rescale factors telescoped with their roundings rho_b, numerator and
// denominator compared after their common factor exp(M - m^_B)), evaluated in double (the exact
// value's own error, ~K 2^-53 of sum |w v|, is far below every bound).
//
// Example:
//   std::vector<const float*> rows = ...;   // K rows of D values, nullptr for index -1
//   SparseAttnRowBound b = sparse_attn_row_bound(q_row, rows, D, sink[h], scale, AttnArith::kMma);
//   ASSERT_LE(std::fabs(out[d] - b.exact[d]), b.bound[d]);
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41::scenarios::judge {

inline constexpr double kBf16MmaStepRel = 0x1p-18;
inline constexpr int kSparseAttnMmaStep = 16;  // indices / channels per mma step

// delta of one tensor-core step: c the accumulator's magnitude bound, products the sum of |a_i b_i|.
inline double bf16_mma_step_error(double c_mag, double products) { return kBf16MmaStepRel * (c_mag + products); }

enum class AttnArith {
  kReference,  // reference/ops/attention.cc
  kMma,        // cuda/attention_mma.cu
};

struct SparseAttnRowBound {
  std::vector<double> exact;  // [D]
  std::vector<double> bound;  // [D], >= 0 (0 where the row has no index: the output is exactly 0)
  double max_score_error = 0; // the largest sigma_j (natural units), for reports
};

// One (query, head) row: q [D] and the K gathered rows (each [D], nullptr = index -1), bf16 values.
SparseAttnRowBound sparse_attn_row_bound(const float* q, const std::vector<const float*>& rows, int64_t D, float sink,
                                         float scale, AttnArith arith, int64_t slice_blocks = 0);

}  // namespace dsv41::scenarios::judge
