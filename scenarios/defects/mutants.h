// scenarios/defects/mutants.h
//
// Planted defects: the reference with one wrong value, at one (step, layer, component). They are
// the verifier's self-test (a verifier that cannot find a planted defect proves nothing) and what
// the tests use to check that a divergence is caught and located to the right place.
//
// Spec: mutant:<component>:L<layer>:S<step>   (layer -1 is written L-1: final_norm_out)
//   a float component (any tensor hook of reference/model/hooks.h, e.g. attn_out, hc_ffn_comb, ffn_in):
//       the first element of the step's LAST row is doubled (its exponent one higher: exact in
//       bf16 and fp32; a zero becomes the smallest normal): one wrong value in one row, large
//       enough to propagate (a one-ulp change is often absorbed by the next rounding)
//   topk:        the last row's largest selected position is replaced by the lowest reachable
//                position it did not select (nothing happens when every position is selected)
//   experts:     the last row's last routed expert is replaced by the lowest expert not routed
//   candidates:  the last row's lowest kept block that is not its newest block is dropped
//   cache.compressed_kv / cache.index_keys / cache.window_kv: after the step, one bit of the layer's
//       newest entry (the lowest bit of its first byte) flips in the stored cache
//   cache.compressor: after the step, the lowest mantissa bit of the first kv value of the layer's
//       newest pending compressor slot flips (nothing when no token is pending)
// Spec mutant:<component>:L<layer>:S<step>:x<factor> (a float component only): instead of the
//   doubled element, every value of the step's LAST ROW (the last dimension: one token's values,
//   of its last mHC stream for [T, hc, dim] tensors) is multiplied by factor (e.g. x1.01), then
//   rounded to bf16 when the row held bf16 values: the small gain error of one row whose detection
//   `dsv41 selftest --sensitivity` measures (a factor inside half a bf16 ulp changes nothing).
// The defect fires once, at exactly that step; what it changes propagates as a real bug would.
//
// Speculative-decoding defects (docs/dspark.md), spec mutant:<defect>:S<step> (no layer: every
// layer), fire in the first speculative round at or after that step where they change something:
//   rollback_compressor  after a partial accept the compressors keep the verify step's slots (the
//                        partial group is not rolled back): changes state when the verify step
//                        crossed a compressor group boundary after the kept tokens
//   rollback_dspark      after a partial accept the DSpark rings keep the verify step's rows in the
//                        rejected positions' slots (bookkeeping rolled back, bytes not): changes
//                        state when such a slot held an earlier position (past the ring's wrap)
//   accept_one_more      the first rejected draft is kept too (the next token: the target's argmax
//                        after it)
//   draft_rope_pos0      a DSpark draft (the "dspark" drafter) rotates every block row at row 0's
//                        position (DraftRopeAtBlockStartOps, round_defects.h): fires in the
//                        first draft at or after the step when the block has 2+ rows
#pragma once

#include <cstdint>
#include <string>

#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "scenarios/defects/round_defects.h"

namespace dsv41::scenarios::defects {

struct Mutation {
  std::string component;  // its name, as written in the spec
  reference::model::Component id = reference::model::Component::kAttnOut;
  int layer = 0;
  int64_t step = 0;
  RoundDefect round = RoundDefect::kNone;  // a speculative-decoding defect
  double row_scale = 0;                    // :x<factor>: the last row scaled (0: the doubled element)
  bool is_round() const { return round != RoundDefect::kNone; }
  bool is_cache() const {
    return !is_round() && reference::model::component_info(id).kind == reference::model::ComponentKind::kCache;
  }
};

// Parses the text after "mutant:" (e.g. "attn_out:L3:S2"); a dsv41::Error names what is wrong.
Mutation parse_mutation(const std::string& spec);

// Applies the defect to a hook value when (component, layer, step) match; returns whether it did.
bool mutate_tensor(const Mutation& m, reference::model::Component what, int layer, int64_t step,
                   reference::Tensor<float>& value);
bool mutate_index(const Mutation& m, reference::model::Component what, int layer, int64_t step,
                  reference::Tensor<int32_t>& value, int64_t n_choices);
bool mutate_mask(const Mutation& m, reference::model::Component what, int layer, int64_t step,
                 reference::Tensor<uint8_t>& value, int block_size);
// Hooks that plant the defect (when its step comes) and then call `inner`: what a mutant backend
// runs a step of T tokens at position `start` with. `*fired` becomes true once the defect applied.
reference::model::ForwardHooks mutated_hooks(const Mutation& m, const reference::model::ForwardHooks& inner,
                                      const reference::ModelConfig& c, int64_t start, int64_t T, int64_t step,
                                      bool* fired);

// Flips the bit in the state's cache after the step (cache mutations only).
bool mutate_cache(const Mutation& m, int64_t step, reference::model::ModelState& state);

}  // namespace dsv41::scenarios::defects
