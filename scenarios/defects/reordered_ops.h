// scenarios/defects/reordered_ops.h
//
// Correct ORDER-VARIANT implementations: the reference's function in the reference's precisions,
// summed in another order, behind the ops seam (reference/seam/ops.h). They are the calibration set
// of `dsv41 selftest --calibration` (docs/selftest.md "Calibration") and the runner's backends
// `ref-order:<variant>` (docs/scenarios.md): a verifier that flags one of
// them under the order-variant claim raises a false alarm on a correct port.
//
// What a variant reorders (every other op forwards to the reference):
//   linear, linear_fp32, grouped_linear  the fp32 accumulation over K (bf16 weights: exact bf16
//                        products; fp8/fp4 weights: the exact 32-element block partials scaled by
//                        their two E8M0 scales), in the variant's order, instead of the
//                        reference's double accumulation (bf16) or left-to-right fp32 (blocks)
//   rms_norm             the fp32 sum of squares, in the variant's order
//   moe_experts          each expert's three linears as above, and the fp32 sum of the experts'
//                        outputs in reverse expert order with the shared expert first
//   sparse_attn          each row's index list permuted (the online softmax's blocks, its fp32
//                        denominator and its accumulator see another order)
//
//   variant     K reduction (n terms, fp32)                                   sparse_attn order
//   reversed    one accumulator, term n-1 down to term 0                      reversed
//   pairwise    a balanced binary tree of fp32 additions                      even slots, then odd
//   blocked     blocks of 64 terms left to right, block sums added in order   rotated by half
//   fma         fp32 FMA chain (a*b + acc, one rounding) left to right        reversed
//   splitk      4 slices of K summed separately, then the 4 partials          rotated by a quarter
//   tiles       tensor-core style: tiles of 16 products summed exactly (one    even slots, then odd
//               rounding to fp32), tiles accumulated in fp32
//
// Not reordered (the reference's order): the indexer's scores, the compressor, the mHC mixes, the
// Engram gate and the head's argmax; their inputs still differ where an upstream op reordered.
//
// Example:
//   std::unique_ptr<reference::seam::Ops> ops = make_reordered_ops(SumOrder::kSplitK);
//   reference::model::Model m(config, weights, token_map, *ops);   // a correct order-variant port
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "reference/seam/ops.h"

namespace dsv41::scenarios::defects {

enum class SumOrder { kReversed, kPairwise, kBlocked, kFma, kSplitK, kTiles, kTrunc13 };
// kTrunc13 ("trunc13") is not in all_sum_orders(): an EMULATION of Hopper's fp8 tensor-core block dot
// (wgmma e4m3: each 32-block's products aligned to the largest one's exponent E and truncated toward
// zero at 2^(E - 14), summed, the sum truncated toward zero to 14 significant bits, then promoted in
// K order as the reference does: the model of tests/cuda/linear_production_test.cc
// Fp8TensorCoreEmulation that matches the H100's bits best, 79% of the block dots, session 15; the
// first model, 13 bits and an exact sum, matched 57%). Only F8 linears (what the production `cuda`
// linear runs, the shared expert's inside moe_experts included) differ; every other op is the
// reference's. Judged under the accumulation fp8-tensor-core (scenarios/judge/derived_bounds.h).

const char* name(SumOrder o);
// Every variant, in the table's order.
const std::vector<SumOrder>& all_sum_orders();
// The variant named `name`; a dsv41::Error listing the names otherwise.
SumOrder sum_order_from_name(const std::string& name);

// The fp32 sum of terms[0..n) in the variant's order (kFma: the terms are summed left to right,
// as the products are fused by the callers that have two factors).
float ordered_sum(const float* terms, int64_t n, SumOrder o);

// kTrunc13's block dot of n E4M3 values a, b: each product aligned to the largest one's exponent E
// and truncated toward zero at 2^(E - 14), summed, the sum truncated toward zero to 14 significant
// bits, then fp32 (bench/RESULTS.md, sessions 14-15: what the H100's wgmma e4m3 measured;
// scenarios/judge/fp8_mma_bound.h bounds it).
float tensor_core_block_dot(const float* a, const float* b, int64_t n);

// The ops of a variant (forwarding every op it does not reorder to the reference). Its name() is
// "reordered(<variant>)".
std::unique_ptr<reference::seam::Ops> make_reordered_ops(SumOrder o);

}  // namespace dsv41::scenarios::defects
