// scenarios/defects/small_bug_ops.h
//
// The ops-level bugs of the self-test's small-bug zoo (scenarios/selftest/small_zoo.h,
// docs/selftest.md "Small bugs"): each a BugOps (scenarios/defects/bug_zoo_forwarding.h) that gets
// one op of ONE layer slightly wrong (a 0.1-1% effect, or one byte of one cache block) and forwards
// everything else to a BASE ops (the CPU reference by default; any backend's ops plants the bug in
// that backend: scenarios/selftest/small_zoo.h SmallZooOptions::base). The layer is the one the op runs for: ForwardingOps'
// current_layer() (every attention sublayer starts with its queries' RoPE), or, for an op that runs
// before that RoPE (the Engram gate, a norm), the identity of the weight tensor it is handed.
//
// Example:
//   std::unique_ptr<reference::seam::Ops> ops = make_softmax_scale_ops(/*layer=*/2, /*factor=*/1.01);
//   reference::model::Model model(config, weights, token_map, *ops);   // layer 2's softmax scale x1.01
#pragma once

#include <memory>

#include "formats/cache_format.h"
#include "reference/ops/config.h"
#include "reference/seam/ops.h"

namespace dsv41::scenarios::defects {

// sparse_attn of `layer` with softmax_scale * factor.
std::unique_ptr<reference::seam::Ops> make_softmax_scale_ops(int layer, double factor,
                                                             const reference::seam::Ops& base = reference::seam::reference_ops());

// Which rows' RoPE a position shift hits.
enum class RopeRows {
  kQuery,     // the attention queries [T, n_heads * head_dim]
  kWindowKv,  // the window KV [T, head_dim] (one head, stride 1; a window-only layer: nothing else matches)
};
// The RoPE of `rows` at `layer` rotated at first_pos + shift (every other rotation official).
std::unique_ptr<reference::seam::Ops> make_rope_shift_ops(const reference::ModelConfig& c, int layer, RopeRows rows,
                                                          int64_t shift,
                                                          const reference::seam::Ops& base = reference::seam::reference_ops());

// Which RMSNorm of a block a defect hits (its weight tensor names it).
enum class BlockNorm { kAttnNorm, kFfnNorm, kQNorm, kKvNorm };
// That RMSNorm of `layer` with its statistic rsqrt(mean(x^2) + eps) rounded to bf16 (the
// activations' dtype) before it scales the row: a gain error of up to 2^-9 per row.
// (reference/ops/rmsnorm.h: the statistic is fp32.)
std::unique_ptr<reference::seam::Ops> make_norm_bf16_statistic_ops(
    int layer, BlockNorm norm, const reference::seam::Ops& base = reference::seam::reference_ops());

// moe_experts of `layer` with expert `expert`'s output (its weighted rows, fp32, before the sum)
// times factor; expert -1: the shared expert's output.
std::unique_ptr<reference::seam::Ops> make_expert_scale_ops(
    int layer, int expert, double factor, const reference::seam::Ops& base = reference::seam::reference_ops());

// engram_gate_residual of `layer` (an Engram layer) with every gate times factor:
// out = bf16(h + (gate * factor) * value).
std::unique_ptr<reference::seam::Ops> make_engram_gate_scale_ops(
    int layer, double factor, const reference::seam::Ops& base = reference::seam::reference_ops());

// index_weights of `layer` (an index source) with the weights' scale times factor:
// bf16(proj * (scale * factor)).
std::unique_ptr<reference::seam::Ops> make_index_weight_scale_ops(
    int layer, double factor, const reference::seam::Ops& base = reference::seam::reference_ops());

// compress of `layer` (a ratio > 1 kv source) with its gate scores times factor (the pooling
// softmax's temperature off).
std::unique_ptr<reference::seam::Ops> make_compressor_score_scale_ops(
    int layer, double factor, const reference::seam::Ops& base = reference::seam::reference_ops());

// One byte of ONE cache entry, once: the first write_entries of `format` at `layer` (step 0 of a
// scenario) gets, in its newest entry, either
//   kScaleByte   block 0's scale byte replaced by the neighbouring valid code (one up; one down
//                from the largest finite code): E4M3 scales (compressed KV) x ~(1 +- 1/8), E8M0
//                scales (window KV, index keys) x2 or x1/2
//   kCodeNibble  element 0's E2M1 code one magnitude step away from zero (one toward it from the
//                largest, 6): FP4 formats only
enum class CacheByteDefect { kScaleByte, kCodeNibble };
std::unique_ptr<reference::seam::Ops> make_cache_byte_ops(
    int layer, formats::CacheFormat format, CacheByteDefect what,
    const reference::seam::Ops& base = reference::seam::reference_ops());

}  // namespace dsv41::scenarios::defects
